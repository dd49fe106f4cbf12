"""Which W&B mode a run starts in: `logger.mode=auto` decided from the environment; whether
W&B's server can be reached, decided once a sweep; and the W&B modules' one way to warn
(`warn`).

auto: wandb's own switch WANDB_MODE when it is set, else online when an API key is configured
(WANDB_API_KEY, WANDB_IDENTITY_TOKEN_FILE, or the netrc entry of the W&B host), else offline.
Online init that then fails falls back to offline (publish/wandb_sink.py).

A sweep whose runs would go online asks once, at its start (`decide_for_sweep`, from the
multirun's callback; a search's too), whether W&B's server answers: one request with its own
bound (PROBE_TIMEOUT_S). With no answer (a compute node without a route out, a closed port)
every run of the sweep and its summary run log offline at once (SWEEP_OFFLINE_ENV, which the
runs' processes inherit: fork server, slots, torchrun, SLURM's exported environment) with one
warning for the sweep, instead of each waiting out its own online init (logger.init_timeout_s,
~30 s a run: 99 s for a 2-point micro sweep, about an hour for 100 points).
"""

from __future__ import annotations

import logging
import netrc
import os
from pathlib import Path
from urllib.parse import urlsplit

from nanogpt.config.spec import LoggerMode

DEFAULT_HOST = "https://api.wandb.ai"
log = logging.getLogger("nanogpt.publish.wandb")


def warn(message: str, about: str = "W&B") -> None:
    """One warning line, `warning: W&B: ...` on stderr (nanogpt/logs.py formats it) and in the
    job's run.log: how every W&B module says that W&B failed and the point goes on."""
    log.warning("%s: %s", about, message)


# Set by the sweep's process when W&B's server did not answer its probe: why. Its runs read it.
SWEEP_OFFLINE_ENV = "NANOGPT_WANDB_UNREACHABLE"
PROBE_TIMEOUT_S = 5.0  # the probe's bound: DNS, connect and the first answer together


def resolve_mode(mode: LoggerMode) -> tuple[str, str | None]:
    """The wandb mode to run in, and why, when it is not the one asked or `auto` chose offline
    or disabled.

    auto: wandb's own switch WANDB_MODE when it is set, else online when an API key is
    configured, else offline. The other modes are taken as asked. Online, by either road, is
    offline in a sweep that found W&B's server out of reach (SWEEP_OFFLINE_ENV).
    """
    mode_now, reason = _asked_mode(mode)
    unreachable = os.environ.get(SWEEP_OFFLINE_ENV)
    if mode_now == "online" and unreachable:
        return "offline", f"W&B unreachable at the sweep's start ({unreachable})"
    return mode_now, reason


def _asked_mode(mode: LoggerMode) -> tuple[str, str | None]:
    if mode is not LoggerMode.auto:
        return mode.value, None
    if env_mode := os.environ.get("WANDB_MODE"):
        return env_mode, f"WANDB_MODE={env_mode}"
    if api_key_configured():
        return "online", None
    return "offline", "no API key (WANDB_API_KEY or ~/.netrc)"


def api_key_configured() -> bool:
    """Where wandb finds a key: the environment, else the netrc entry for the W&B host."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlsplit(os.environ.get("WANDB_BASE_URL", DEFAULT_HOST)).netloc
    path = Path(os.environ.get("NETRC", "~/.netrc")).expanduser()
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def base_url() -> str:
    """The W&B server runs talk to: WANDB_BASE_URL, else W&B's own."""
    return os.environ.get("WANDB_BASE_URL") or DEFAULT_HOST


def decide_for_sweep(backend: str, mode: LoggerMode) -> str | None:
    """Once a sweep, in its own process before any run: where its runs would go online, probe
    W&B's server; out of reach, every run of the sweep (and its summary run) logs offline
    (SWEEP_OFFLINE_ENV). Returns the sweep's one warning line then, else None. A decision of an
    earlier sweep in this process is dropped first."""
    os.environ.pop(SWEEP_OFFLINE_ENV, None)
    if backend != "wandb" or resolve_mode(mode)[0] != "online":
        return None
    url = base_url()
    why = unreachable(url)
    if why is None:
        return None
    os.environ[SWEEP_OFFLINE_ENV] = why
    return (
        f"warning: W&B: {url} cannot be reached ({why}); every run of this sweep logs offline "
        "(each prints its `wandb sync` command)"
    )


def unreachable(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why W&B's server at `url` did not answer one request within `timeout_s`, or None when it
    answered (any HTTP status: a refused key is the runs' own online failure to report). The
    request runs in a thread of its own, so a name lookup that hangs is bounded too."""
    import threading
    import urllib.error
    import urllib.request

    outcome: list[str | None] = []

    def ask() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout_s)
            outcome.append(None)
        except urllib.error.HTTPError:
            outcome.append(None)  # an answer: the server is there
        except (OSError, ValueError) as err:  # URLError, a timeout, a malformed URL
            reason = getattr(err, "reason", err)
            outcome.append(f"{type(reason).__name__}: {reason}")

    probe = threading.Thread(target=ask, name="wandb-probe", daemon=True)
    probe.start()
    probe.join(timeout_s)
    return outcome[0] if outcome else f"no answer within {timeout_s:g} s"

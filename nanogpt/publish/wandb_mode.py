"""Which W&B mode a run starts in: `logger.mode=auto` decided from the environment; and the
W&B modules' one way to warn (`warn`).

auto: wandb's own switch WANDB_MODE when it is set, else online when an API key is configured
(WANDB_API_KEY, WANDB_IDENTITY_TOKEN_FILE, or the netrc entry of the W&B host), else offline.
Online init that then fails falls back to offline (publish/wandb_sink.py).
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


def resolve_mode(mode: LoggerMode) -> tuple[str, str | None]:
    """The wandb mode to run in, and why, when `auto` chose offline or disabled.

    auto: wandb's own switch WANDB_MODE when it is set, else online when an API key is
    configured, else offline. The other modes are taken as asked.
    """
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

"""Hydra-style target nodes as plain data: `{_target_: "mymod.GPT", config: {_target_: ...}}`.

`model.build` crosses from the entry point to the measuring child as the plain dict
`OmegaConf.to_object` makes of it (library code imports no Hydra, ARCHITECTURE.md). This module
does what `hydra.utils.instantiate` would do with it, with importlib, and no more: the longest
importable module of `_target_`, then attributes; nested `_target_` dicts built first, depth
first; lists walked; every other key passed as a keyword argument. `_partial_` and `_args_`
are Hydra's too: `_args_` positional arguments, `_partial_: true` a functools.partial.

Without importing anything, `source_file` finds the file a target's module lives in (importlib's
PathFinder walks sys.path as `import` would, but executes nothing): the sweep's process checks
that a model's module is there and hashes its source for the point's identity
(record/identity.py), while only the measuring child imports it (a user's module may touch
CUDA at import, and a process that did must not fork).

`code_dir` is the directory the command ran in: put first on sys.path, as `python -m` puts it,
in whichever process builds the node (a forked child, a fresh interpreter, a SLURM node).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

from nanogpt.config.errors import ConfigError

HYDRA_KEYS = ("_target_", "_partial_", "_args_", "_recursive_", "_convert_")


class TargetError(Exception):
    """A node that cannot be built: `key` is the dotted config key, the message says why."""

    def __init__(self, key: str, problem: str):
        super().__init__(f"{key}: {problem}")
        self.key, self.problem = key, problem


def _search_path(code_dir: str | None) -> list[str]:
    return ([code_dir] if code_dir else []) + [p or "." for p in sys.path]


def _locate(target: str, code_dir: str | None) -> tuple[str, Path | None, list[str]] | None:
    """The longest module prefix of `target` on the search path (code_dir first), found without
    executing any module: its name, its source file (None: built in, or a namespace package)
    and the attribute names after it. None when no prefix is a module."""
    parts = target.split(".")
    found, locations = None, _search_path(code_dir)
    for cut in range(1, len(parts)):
        name = ".".join(parts[:cut])
        spec = importlib.machinery.PathFinder.find_spec(name, locations)
        if spec is None:
            # a module the running interpreter already has (a builtin, a frozen one)
            spec = importlib.util.find_spec(name) if cut == 1 and name in sys.modules else None
        if spec is None:
            break
        real = spec.origin and spec.origin not in ("built-in", "frozen")
        found = (name, Path(spec.origin) if real else None, parts[cut:])
        if not spec.submodule_search_locations:
            break
        locations = list(spec.submodule_search_locations)
    return found


def source_file(target: str, code_dir: str | None) -> Path | None:
    """The source file of the longest module prefix of `target` that exists on the search path
    (code_dir first), found without executing any module; None when no prefix is found."""
    found = _locate(target, code_dir)
    return found[1] if found else None


def source_digest(target: str, code_dir: str | None) -> str | None:
    """sha256 (16 hex digits) of the target's source file; None when it has none."""
    path = source_file(target, code_dir)
    if path is None or not path.is_file():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def import_target(target: str, key: str, code_dir: str | None = None):
    """The callable `target` names, imported with code_dir first on sys.path. A module that
    exists but fails to import is reported with its own error, not passed over."""
    if code_dir and code_dir not in sys.path:
        sys.path.insert(0, code_dir)
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            found = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name and module_name.startswith(err.name):  # this prefix is not a module
                continue
            raise TargetError(key, f"'{target}': {type(err).__name__}: {err}") from None
        except Exception as err:  # noqa: BLE001 - the user's module failed at import: say how
            raise TargetError(key, f"'{target}': {type(err).__name__}: {err}") from None
        try:
            for name in parts[cut:]:
                found = getattr(found, name)
        except AttributeError:
            rest = ".".join(parts[cut:])
            raise TargetError(key, f"'{target}': module {module_name} has no {rest}") from None
        if not callable(found):
            raise TargetError(key, f"'{target}' is not callable")
        return found
    raise TargetError(key, f"'{target}': no module of it can be imported (searched {code_dir})")


def instantiate(node, key: str, code_dir: str | None = None):
    """Build `node` as hydra.utils.instantiate would: nested targets first. A constructor that
    refuses its arguments is one TargetError naming the node's key and the error."""
    if isinstance(node, list):
        return [instantiate(v, f"{key}[{i}]", code_dir) for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    kwargs = {
        k: instantiate(v, f"{key}.{k}", code_dir) for k, v in node.items() if k not in HYDRA_KEYS
    }
    if "_target_" not in node:
        return kwargs
    target = node["_target_"]
    if not isinstance(target, str) or not target:
        raise TargetError(f"{key}._target_", "is not set: name a class or factory, e.g. mymod.GPT")
    made = import_target(target, f"{key}._target_", code_dir)
    args = [instantiate(v, f"{key}._args_", code_dir) for v in node.get("_args_", [])]
    if node.get("_partial_"):
        return functools.partial(made, *args, **kwargs)
    try:
        return made(*args, **kwargs)
    except TypeError as err:
        raise TargetError(key, f"{target}(...) refused its arguments: {err}") from None


@functools.cache
def _tree(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None


BLOCKS = ast.If | ast.Try | ast.With | ast.For | ast.While  # statements that hold statements


def _statements(body: list) -> list:
    """A module's top-level statements, with those inside its top-level blocks (if, try,
    with, for, while), where a name is bound for the module too."""
    out = []
    for node in body:
        out.append(node)
        if isinstance(node, BLOCKS):
            for block in ("body", "orelse", "finalbody"):
                out += _statements(getattr(node, block, []))
            for handler in getattr(node, "handlers", []):
                out += _statements(handler.body)
    return out


def _dynamic(tree: ast.Module) -> bool:
    """Whether the module may bind names that no statement names: `globals()`, `exec`,
    `setattr` on a module, a module `__getattr__` (lazy attributes)."""
    called = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    defined = {getattr(node, "name", None) for node in tree.body}
    return bool(called & {"globals", "exec", "setattr"}) or "__getattr__" in defined


def _binding(module: str, path: Path | None, name: str, code_dir: str | None, depth: int = 0):
    """How a module's source binds `name` at its top level, read with ast (nothing runs): the
    def or class itself (followed through `from m import name` into m), True where it binds it
    some other way or may (an assignment, a compiled module, `import *`, `_dynamic`), False
    where it does not."""
    tree = _tree(path) if path is not None and path.suffix == ".py" and depth < 8 else None
    if tree is None:
        return True  # not read: say nothing against it
    maybe = _dynamic(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in _statements(tree.body):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == name:
                return node
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(name in {n.id for n in ast.walk(t) if isinstance(n, ast.Name)} for t in targets):
                return True
        elif isinstance(node, ast.Import):
            if any((a.asname or a.name.partition(".")[0]) == name for a in node.names):
                return True
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            source = ".".join(p for p in (base, node.module or "") if p)
            for alias in node.names:
                maybe |= alias.name == "*"
                if (alias.asname or alias.name) == name:
                    # the trailing dot asks whether alias.name is itself a module
                    found = _locate(f"{source}.{alias.name}.", code_dir)
                    if found is None or found[2] != [alias.name, ""]:
                        return True  # a submodule, or a module not found from here: not read
                    return _binding(found[0], found[1], alias.name, code_dir, depth + 1)
    return True if maybe else False


def definition(target: str, code_dir: str | None):
    """What `target` names, read from its module's source without importing it: the def or
    class (an ast node), True when it is there but not read so, False when the module is found
    and does not define it, None when no module of it is found."""
    found = _locate(target, code_dir)
    if found is None:
        return None
    module, path, rest = found
    if not rest:
        return True  # the target is a module itself
    bound = _binding(module, path, rest[0], code_dir)
    return bound if len(rest) == 1 or bound is False else True


def static_arguments(target: str, code_dir: str | None) -> set[str] | None:
    """The keyword arguments `target` takes, read from its source with `ast` (nothing runs):
    a function's parameters, a class's `__init__`'s, a dataclass's fields. None when they
    cannot be read so (a target defined elsewhere, **kwargs, an inherited `__init__`)."""
    found = definition(target, code_dir)
    if isinstance(found, ast.FunctionDef | ast.AsyncFunctionDef):
        return _parameters(found)
    if not isinstance(found, ast.ClassDef):
        return None
    init = next((n for n in found.body if getattr(n, "name", None) == "__init__"), None)
    if isinstance(init, ast.FunctionDef):
        return _parameters(init)
    decorators = {ast.unparse(d).split("(")[0] for d in found.decorator_list}
    if init is None and not found.bases and decorators & {"dataclass", "dataclasses.dataclass"}:
        return {n.target.id for n in found.body if isinstance(n, ast.AnnAssign)}
    return None


def _parameters(func: ast.FunctionDef) -> set[str] | None:
    args = func.args
    if args.kwarg is not None:
        return None
    return {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)} - {"self"}


def require_target(node: dict, key: str, example: str) -> str:
    """A build node's `_target_` (model.build, optimizer.build), refused in one line when it
    is not named."""
    target = node.get("_target_")
    if not target or not isinstance(target, str):
        raise ConfigError(f"{key}._target_", "is not set", f"name a class, e.g. {example}")
    return target


def check_node(node: dict, key: str, code_dir: str | None) -> None:
    """A target node and the nodes inside it, without importing anything: the module is there,
    it defines the name, and each key is an argument its source declares (read with ast where
    it can be). model.build and optimizer.build are both checked so."""
    target = node.get("_target_")
    if target is not None:
        found = definition(target, code_dir) if isinstance(target, str) and "." in target else None
        if found is None:
            module = str(target).rpartition(".")[0] or target
            raise ConfigError(
                f"{key}._target_",
                f"'{target}': no module {module} in {code_dir} or on sys.path",
                "run from the directory that holds it, or set model.code_dir",
            )
        if found is False:
            module, _, rest = _locate(target, code_dir)
            raise ConfigError(
                f"{key}._target_",
                f"'{target}': module {module} has no {rest[0]}",
                f"name a class or function that {module} defines",
            )
        refuse_unknown(key, node, HYDRA_KEYS, static_arguments(target, code_dir), target)
    for name, value in node.items():
        if isinstance(value, dict):
            check_node(value, f"{key}.{name}", code_dir)


def refuse_unknown(key: str, names, hydra_keys, takes: set[str] | None, target: str) -> None:
    """One ConfigError line for the first of `names` (a node's keys, under config key `key`)
    that is neither one of Hydra's own keys nor an argument `target` takes (None: not known,
    nothing refused)."""
    for name in names:
        if takes is not None and name not in (*hydra_keys, *takes):
            raise ConfigError(
                f"{key}.{name}",
                f"is no argument of {target}",
                f"use one of {', '.join(sorted(takes)) or '(none)'}",
            )

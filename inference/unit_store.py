"""An on-disk store of compiled units: a later process loads a unit instead of tracing it again.

With Inductor's on-disk cache warm, what a CPU unit still spends is dynamo's tracing: ~5-7 s a unit of
the real target (`acchead.inference.compile_regions`), 63 s for the real pair's 10 target units, ~14 s a
unit of the demo target (docs/speed.md). torch's ahead-of-time capture (`torch.compile(...).aot_compile`,
experimental in 2.13) serializes a traced and compiled function, its bytecode included; loading one takes
~0.1-0.6 s. So the first process to compile a unit stores it, under a digest of everything the unit was
specialised on, and later processes load it.

What the digest holds (`stable_form` of the call's arguments, and `_environment`): every argument's type
and contents down to plain values (numbers, strings, functions by module, name and code, a closure's
cells, objects by their attributes, modules by their submodules, parameters' names, shapes and dtypes,
configs), each tensor's metadata (shape, strides, dtype, device: its values are the graph's inputs), the
global state dynamo guards on, the compile settings, the versions of torch, transformers and kernels,
acchead's own source, the machine's CPU instruction set and the TORCH* environment; not where a model
was loaded from. A unit's weights are inputs (a loaded unit reads the model it is given;
tests/test_unit_store.py changes the weights between store and load): one whose weights are frozen into
the graph (Inductor's freezing, which `compiled_units` never sets; torch 2.13 cannot capture it either)
is never stored. Anything the digest cannot describe stably (an object without attributes, a symbolic
token count) leaves the unit to the usual compilation; so does any failure to capture, save or load,
logged: a store is a cache, and a decode never fails for it.

Objects that differ only in what no unit reads share a unit: a class names such attributes in
`untraced_attributes` (a stop policy's threshold kept as a float beside the tensor its traced `judge` reads,
and its spec), and the digest leaves them out, as dynamo's guards, which check only what a graph read, let
one traced graph serve such objects in a process. A name left off the list costs only a capture of its own;
a name on it that a unit reads would serve a stale constant, so tests/test_unit_store.py runs each policy's
stored judge on the arguments of another policy with the same digest against that policy's own.

`ACCHEAD_UNIT_STORE`: a directory for the store (default: `acchead-units` inside Inductor's cache
directory, so that a new `TORCHINDUCTOR_CACHE_DIR` starts both empty), or `0` to switch it off.
`ACCHEAD_UNIT_STORE_GB` (default 2): past that size a save removes the units used least recently (a load
marks a unit used), so the units of older versions of acchead or torch, never loaded again, go first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import hashlib
import logging
import os
import platform
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from acchead.errors import AccheadError

log = logging.getLogger(__name__)

STORE_ENV = "ACCHEAD_UNIT_STORE"
LIMIT_ENV = "ACCHEAD_UNIT_STORE_GB"
DEFAULT_LIMIT_GB = 2.0  # ~1,000 of the real target's units: its fast-path bench stores 25, 43 MB
# A class attribute: the names of an object's attributes that no compiled unit reads (module docstring).
UNTRACED = "untraced_attributes"
_FORMAT = 1  # raised whenever what a stored file holds, or how it is keyed, changes
_OFF = {"0", "off", "false", "no"}
# Where transformers loaded a model or config from: not what it computes (a copy elsewhere, the same graph)
_PATHS = ("_name_or_path", "name_or_path")
_PLAIN = (type(None), type(Ellipsis), bool, int, float, complex, str, bytes)


def tensor_key(t: torch.Tensor) -> tuple:
    """What dynamo's tensor guard checks of a tensor (shape, strides, dtype, device, requires_grad, whether it
    is an inference tensor: each of them, changed, fails the guard; its values are graph inputs)."""
    return (tuple(t.shape), t.stride(), t.dtype, t.device, t.requires_grad, t.is_inference())


class Unstable(Exception):
    """An argument the digest cannot describe the same way in another process."""


def stable_form(obj: Any, _path: tuple[int, ...] = ()) -> Any:
    """`obj` as nested tuples of plain values, equal in every process for equal arguments; raises `Unstable`
    for what it cannot describe. Tensors by their metadata only (see the module docstring)."""
    if isinstance(obj, _PLAIN):
        return (type(obj).__name__, repr(obj))
    if isinstance(obj, (torch.dtype, torch.device, torch.Size, enum.Enum)):
        return (type(obj).__name__, str(obj))
    if isinstance(obj, torch.Tensor):
        return ("tensor", type(obj).__name__, stable_form(tensor_key(obj), _path))
    if id(obj) in _path:  # a cycle (a module's parent reference, a config's back link)
        return ("cycle", _path.index(id(obj)))
    path = (*_path, id(obj))
    if isinstance(obj, (tuple, list)):
        return (type(obj).__name__, tuple(stable_form(x, path) for x in obj))
    if isinstance(obj, dict):
        items = [(stable_form(k, path), stable_form(v, path)) for k, v in obj.items()]
        return (type(obj).__name__, tuple(sorted(items, key=repr)))
    if isinstance(obj, (set, frozenset)):
        return (type(obj).__name__, tuple(sorted((stable_form(x, path) for x in obj), key=repr)))
    if isinstance(obj, functools.partial):
        return ("partial", stable_form(obj.func, path), stable_form(obj.args, path),
                stable_form(obj.keywords, path))  # fmt: skip
    if isinstance(obj, types.MethodType):
        return ("method", stable_form(obj.__func__, path), stable_form(obj.__self__, path))
    if isinstance(obj, types.FunctionType):
        cells = tuple(c.cell_contents for c in obj.__closure__ or ())
        defaults = (obj.__defaults__, obj.__kwdefaults__)
        return ("function", obj.__module__, obj.__qualname__, _code_form(obj.__code__),
                stable_form(defaults, path), stable_form(cells, path))  # fmt: skip
    if isinstance(obj, (types.BuiltinFunctionType, type)):
        return ("named", getattr(obj, "__module__", None), obj.__qualname__)
    if isinstance(obj, torch.nn.Module):
        # Its submodules, parameters and buffers through the public iterators; the rest of its state (the
        # config, flags, hooks) as attributes.
        skip = ("_parameters", "_buffers", "_modules", *_PATHS)
        state = {k: v for k, v in vars(obj).items() if k not in skip}
        tensors = [*obj.named_parameters(recurse=False), *obj.named_buffers(recurse=False)]
        return ("module", _type_name(obj), stable_form(state, path), stable_form(tensors, path),
                stable_form(list(obj.named_children()), path))  # fmt: skip
    if isinstance(obj, _configs()):  # by their public dict, which leaves out a per-process hash
        fields = {k: v for k, v in obj.to_dict().items() if k not in _PATHS}
        return ("config", _type_name(obj), stable_form(fields, path))
    if dataclasses.is_dataclass(obj):
        fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        return ("dataclass", _type_name(obj), stable_form(fields, path))
    state = getattr(obj, "__dict__", None)
    slots = [s for cls in type(obj).__mro__ for s in getattr(cls, "__slots__", ()) if hasattr(obj, s)]
    if state is None and not slots:
        raise Unstable(f"cannot describe a {_type_name(obj)} stably")
    attrs = {**(state or {}), **{s: getattr(obj, s) for s in slots}}
    for name in getattr(type(obj), UNTRACED, ()):
        attrs.pop(name, None)
    return ("object", _type_name(obj), stable_form(attrs, path))


@functools.cache
def _configs() -> tuple[type, ...]:
    from transformers import GenerationConfig, PretrainedConfig

    return (PretrainedConfig, GenerationConfig)


def _type_name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _code_form(code: types.CodeType) -> tuple:
    # (a frozenset constant, `x in {"a", "b"}`, is ordered by string hashes, which differ per process)
    consts = tuple(_code_form(c) if isinstance(c, types.CodeType) else stable_form(c) for c in code.co_consts)
    return (code.co_name, code.co_code.hex(), consts, code.co_names, code.co_varnames)


@functools.cache
def _environment() -> tuple:
    """What a unit's code depends on beyond its arguments: versions, acchead's source, the machine."""
    from importlib import metadata

    from torch._inductor.cpu_vec_isa import pick_vec_isa

    import acchead

    source = hashlib.sha256()
    # the code a unit traces: the models' (acchead's core) and the decoder's (this package)
    packages = (("acchead", Path(acchead.__file__).parent), ("acchead.inference", Path(__file__).parent))
    for name, root in packages:
        for file in sorted(root.glob("*.py")):
            source.update(f"{name}/{file.name}".encode())
            source.update(file.read_bytes())
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("TORCH") and "CACHE_DIR" not in k)
    versions = []
    for name in ("torch", "transformers", "kernels"):  # kernels: the attention's wrapper (compile_regions)
        try:
            versions.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            versions.append((name, None))
    return (_FORMAT, torch.__version__, tuple(versions), source.hexdigest(), platform.machine(),
            str(pick_vec_isa()), tuple(env))  # fmt: skip


def digest(*parts: Any) -> str:
    """A file name for a unit specialised on `parts` (raises `Unstable`)."""
    return hashlib.sha256(repr((_environment(), stable_form(parts))).encode()).hexdigest()[:40]


def _no_guards(entries: list) -> list[bool]:
    """Keep none of dynamo's guards: the digest names the unit (as `compile_units`' key does in a process),
    and a loaded unit rebuilds every guard it keeps (364 of the real target's weights: 0.3 s a unit)."""
    return [False] * len(entries)


def _symbolic(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and bool(getattr(x, "_dynamo_dynamic_indices", None))


class UnitStore:
    """Compiled units on disk (see the module docstring). `hits` and `saves` count what this store did."""

    def __init__(self, root: str | os.PathLike, limit_bytes: int | None = None) -> None:
        self.root = Path(root)
        self.limit_bytes = limit_bytes if limit_bytes is not None else _limit_from_env()
        self.hits = 0
        self.saves = 0
        self.evicted = 0

    @classmethod
    def default(cls) -> UnitStore | None:
        """The store `ACCHEAD_UNIT_STORE` names (module docstring), or None where it is switched off."""
        value = os.environ.get(STORE_ENV, "")
        if value.lower() in _OFF or not hasattr(torch.compiler, "load_compiled_function"):
            return None  # switched off, or a torch without ahead-of-time capture (before 2.10)
        if value:
            return cls(value)
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        return cls(Path(cache_dir()) / "acchead-units")

    def unit(
        self, fn: Callable, settings: Any, args: tuple, kwargs: dict[str, Any], state: Any = None
    ) -> Callable | None:
        """`fn` (a plain function, compiled with `settings`: `torch.compile`'s keyword arguments) for these
        arguments: loaded if stored, else captured ahead of time and stored; None where it cannot be, and
        the caller compiles it the usual way. `state`: the process-wide settings dynamo guards every graph
        on (`compiled_units.global_state`). Call it in the context the unit compiles in (the regions'
        marks, Inductor's settings)."""
        import torch._inductor.config as inductor_config

        if inductor_config.freezing or inductor_config.force_disable_caches:
            return None  # frozen weights are the graph's constants; a capture needs the caches
        if any(map(_symbolic, (*args, *kwargs.values()))):
            return None  # one graph for many token counts: dynamo's own cache serves those
        try:
            name = digest(fn.__module__, fn.__qualname__, _code_form(fn.__code__), settings, args, kwargs,
                          state, _inductor_settings())  # fmt: skip
        except Unstable as err:
            log.debug("%s: not stored: %s", fn.__name__, err)
            return None
        file = self.root / f"{name}.unit"
        try:
            with open(file, "rb") as f:
                loaded = torch.compiler.load_compiled_function(f)
            loaded.disable_guard_check()
            with contextlib.suppress(OSError):  # (a store another user shares, read-only)
                os.utime(file)  # used now: eviction removes the least recently used first
            self.hits += 1
            return loaded
        except FileNotFoundError:
            pass  # not stored (or evicted by another process meanwhile)
        except Exception as err:  # a cache: an unreadable file is compiled again
            log.warning("compiled unit %s could not be loaded (%s); compiling it again", file, err)
        try:
            captured = _capture(fn, settings, args, kwargs)
        except Exception as err:  # an experimental capture: the usual path serves
            log.warning("%s: ahead-of-time capture failed (%r); compiling the usual way", fn.__name__, err)
            return None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            captured.save_compiled_function(str(file))  # atomic: a temporary file, then a rename
            self.saves += 1
            self._evict(keep=file)
        except Exception as err:  # unwritable, unpicklable: the unit still runs
            log.warning("compiled unit %s not stored: %s", file, err)
        return captured

    def _evict(self, keep: Path) -> None:
        """Remove the least recently used units until the store fits `limit_bytes` (never `keep`, the unit
        just saved). Another process may remove or add files meanwhile: a missing file is skipped."""
        files = []
        for file in self.root.glob("*.unit"):
            try:
                stat = file.stat()
            except FileNotFoundError:
                continue
            files.append((stat.st_mtime, stat.st_size, file))
        total = sum(size for _, size, _ in files)
        for _, size, file in sorted(files, key=lambda x: x[0]):
            if total <= self.limit_bytes:
                break
            if file == keep:
                continue
            file.unlink(missing_ok=True)
            total -= size
            self.evicted += 1


def _capture(fn: Callable, settings: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
    """`fn` traced and compiled ahead of time for these arguments, with no guards kept (`_no_guards`).
    Once more where Inductor asks dynamo to trace again (a float it could not turn into a tensor, which
    the second trace keeps as a constant: dynamo restarts so itself, but `aot_compile` does not)."""
    import torch._dynamo.exc

    restart = getattr(torch._dynamo.exc, "TensorifyScalarRestartAnalysis", ())
    options = {**settings.get("options", {}), "guard_filter_fn": _no_guards}
    try:
        captured = torch.compile(fn, **{**settings, "options": options}).aot_compile((args, kwargs))
    except restart:
        captured = torch.compile(fn, **{**settings, "options": options}).aot_compile((args, kwargs))
    captured.disable_guard_check()
    return captured


def _limit_from_env() -> int:
    """`ACCHEAD_UNIT_STORE_GB` in bytes (default `DEFAULT_LIMIT_GB`); a value that is not a number is
    refused in one line (`AccheadError`)."""
    value = os.environ.get(LIMIT_ENV, "")
    try:
        gb = float(value) if value else DEFAULT_LIMIT_GB
    except ValueError:
        raise AccheadError(f"{LIMIT_ENV} must be a number of gigabytes, got {value!r}") from None
    if not gb >= 0:
        raise AccheadError(f"{LIMIT_ENV} must be a number of gigabytes >= 0, got {value!r}")
    return int(gb * 2**30)


def _inductor_settings() -> dict[str, Any]:
    """The Inductor settings a unit compiles under that `compile_units` patches (the rest are the defaults of
    the torch version in the digest, or TORCHINDUCTOR_* in the environment)."""
    import torch._inductor.config as inductor_config

    c = inductor_config
    return {"cpp_wrapper": c.cpp_wrapper, "weight_prepack": c.cpp.weight_prepack,
            "size_asserts": c.size_asserts, "alignment_asserts": c.alignment_asserts}  # fmt: skip

"""This machine's speed profile: what ``attnlab tune`` measured here, read by ``auto`` (issue #27).

``auto``'s built-in rules were measured on one machine per CPU class (``cpu.py``), and two machines of one
class can still disagree (cores, caches, memory, a VM's neighbours). ``attnlab tune`` times the compiled
kernel against torch's SDPA on this machine and writes a profile; ``auto`` then reads its choices from it
where it holds a measurement and falls back on the class rules elsewhere. ``explain()`` names the source.

What a profile holds (JSON, one file per machine key, ``profile_dir()``):

* ``plain``: rows (dtype, mask none|causal, mode fwd|fwdbwd, n, D) with the median ms of ``sdpa`` and
  ``native``: ``auto`` takes the faster for a plain request of that kind at the nearest measured n, unless
  the two are within ``TIE`` of each other there (a tie, which the class rules decide);
* ``masked``: rows (dtype, mode, n, D, skippable) with the same two timings, for key padding that leaves the
  fraction ``skippable`` of the tiles empty: ``auto`` takes the kernel from the smallest fraction at which it
  won (and won at every larger measured one), SDPA below it.

A profile applies only to the machine key it was measured under: CPU model, features, torch threads, torch,
attnlab and kernel build (its level and its file's size and time); a file under another key is never read.
``ATTNLAB_CACHE_DIR`` moves the directory (default ``$XDG_CACHE_HOME/attnlab`` or ``~/.cache/attnlab``);
``ATTNLAB_PROFILE=off`` ignores profiles.

Example::

    prof = current_profile()                  # None until `attnlab tune` has run on this machine
    prof.plain_choice("bfloat16", causal=True, grad=False, n=4096) if prof else None   # ('sdpa', 'this ...')
"""
from __future__ import annotations

import datetime
import functools
import hashlib
import importlib.metadata
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from .cpu import cpu_features, cpu_model

__all__ = ["Profile", "machine_key", "profile_dir", "profile_path", "current_profile", "current_plain_steps",
           "step_choice", "save_profile", "PROFILE_VERSION", "TIE", "tied"]

PROFILE_VERSION = 1
log = logging.getLogger(__name__)


def machine_key() -> dict:
    """What a profile's figures depend on besides the request: the CPU, its features, torch's thread count,
    the versions and the kernel build: its level and its file (size and modification time, so a rebuilt
    kernel, which the version does not name in a developer's checkout, is tuned again). Threads are read on
    every call: ``torch.set_num_threads`` changes it."""
    from .backends import native
    feats = sorted(name for name, has in cpu_features().items() if has)
    return {"cpu_model": cpu_model(), "features": feats, "threads": torch.get_num_threads(),
            "torch": torch.__version__, "attnlab": _version(), "native_build": native.ISA,
            "native_file": _kernel_stamp(getattr(native._native, "__file__", None))}


@functools.lru_cache(maxsize=4)
def _kernel_stamp(path: Optional[str]) -> Optional[str]:
    """'size mtime_ns' of the loaded kernel module's file (None without one)."""
    if path is None:
        return None
    st = os.stat(path)
    return f"{st.st_size} {st.st_mtime_ns}"


@functools.lru_cache(maxsize=1)
def _version() -> str:
    """attnlab's installed version (from the package metadata: ``functional`` imports nothing above it)."""
    try:
        return importlib.metadata.version("attnlab")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def profile_dir() -> Path:
    """Where profiles live: ``$ATTNLAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/attnlab``, else ``~/.cache/attnlab``."""
    base = os.environ.get("ATTNLAB_CACHE_DIR")
    if base:
        return Path(base) / "profiles"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "attnlab" / "profiles"


def profile_path(key: Optional[dict] = None) -> Path:
    """The profile file of ``key`` (this machine's by default): a hash of the key names it."""
    key = machine_key() if key is None else key
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return profile_dir() / f"profile-{digest}.json"


# Two timings of one tune closer than this are a tie. A tune times each pair a few times, and on the Intel Xeon
# with AMX its ratio moved by up to 13% against the grid run beside it (bf16 forward without a mask at n = 1024:
# native 1.03x SDPA in the tune, 0.90x in the grid; docs/benchmarks.md, "Issue #27: auto on a noisy day"). A tie
# is left to the class's built-in rule, which rests on several runs, rather than to one tune's coin flip.
TIE = 1.03


def tied(ms: dict[str, float]) -> bool:
    """Are a plain row's two timings ({"native": ms, "sdpa": ms}) within TIE of each other?"""
    return max(ms.values()) < TIE * min(ms.values())


@dataclass(frozen=True)
class Profile:
    """A profile as read from disk: its rows, and the choices ``auto`` takes from them."""
    path: Path
    key: dict
    measured_at: str
    plain: tuple[dict, ...]
    masked: tuple[dict, ...]
    D: int                                   # the head dim measured: applies where the kernel's path is D's

    @classmethod
    def from_json(cls, data: dict, path: Path) -> "Profile":
        if data.get("version") != PROFILE_VERSION:
            raise ValueError(f"profile version {data.get('version')!r}, this attnlab reads {PROFILE_VERSION}")
        rows = data["plain"] + data["masked"]
        for r in rows:
            if not all(math.isfinite(r["ms"][b]) and r["ms"][b] > 0 for b in ("sdpa", "native")):
                raise ValueError(f"a row without two positive timings: {r}")
        heads = {r["D"] for r in rows}
        if len(heads) != 1:
            raise ValueError(f"rows of head dims {sorted(heads)}; a profile measures one")
        return cls(path, data["key"], data["measured_at"], tuple(data["plain"]), tuple(data["masked"]),
                   heads.pop())

    def source(self) -> str:
        """How ``explain()`` names this profile."""
        return f"this machine's profile ({self.path}, measured {self.measured_at[:16]} by `attnlab tune`)"

    def plain_choice(self, dtype: str, causal: bool, grad: bool, n: float) -> Optional[tuple[str, str]]:
        """('native' | 'sdpa', why) for a plain request at ``n = sqrt(L * S)``, from the measured row of the
        same dtype, mask and mode nearest to n on a log scale; None where none was measured, or where that
        row is a tie (the two within TIE of each other)."""
        return step_choice(self.plain_steps(dtype, causal, grad), n * n)

    def plain_steps(self, dtype: str, causal: bool, grad: bool) -> Steps:
        """The plain rows of one kind as steps over L * S, smallest n first: (the largest L * S nearer this
        row's n than the next one's on a log scale, None for the last; 'native' | 'sdpa', None for a tie; why).
        Constants, so that a torch.compile graph can walk them (``step_choice``) on symbolic sizes."""
        mask, mode = ("causal" if causal else "none"), ("fwdbwd" if grad else "fwd")
        rows = sorted((r for r in self.plain if r["dtype"] == dtype and r["mask"] == mask and r["mode"] == mode),
                      key=lambda r: r["n"])
        steps = []
        for r, above in zip(rows, rows[1:] + [None]):
            bound = None if above is None else r["n"] * above["n"]     # sqrt(L * S) at their geometric mean
            win = None if tied(r["ms"]) else min(("native", "sdpa"), key=lambda b: r["ms"][b])
            why = (f"{dtype} {mask} {mode} at n = {r['n']}, D = {self.D}: native {r['ms']['native']:.3g} ms, "
                   f"sdpa {r['ms']['sdpa']:.3g} ms on {self.source()}")
            steps.append((bound, win, why))
        return tuple(steps)

    def masked_choice(self, dtype: str, grad: bool, skippable: float) -> Optional[tuple[str, str]]:
        """('native' | 'sdpa', why) for a masked request whose mask leaves ``skippable`` of the tiles empty:
        the kernel from the smallest measured fraction at which it won and kept winning, SDPA below it;
        None above the largest fraction measured when the kernel never won (the class rule decides)."""
        mode = "fwdbwd" if grad else "fwd"
        rows = sorted((r for r in self.masked if r["dtype"] == dtype and r["mode"] == mode),
                      key=lambda r: r["skippable"])
        if not rows:
            return None
        wins = [r["ms"]["native"] < r["ms"]["sdpa"] for r in rows]
        first = next((i for i in range(len(rows)) if all(wins[i:])), None)
        where = f"{dtype} {mode} key padding at n = {rows[0]['n']}, D = {self.D}, on {self.source()}"
        if first is not None and skippable >= rows[first]["skippable"]:
            return "native", (f"a mask leaving {skippable:.0%} of the tiles empty; the compiled kernel won from "
                              f"{rows[first]['skippable']:.0%} empty ({where})")
        if skippable <= rows[-1]["skippable"]:
            least = "never won up to " if first is None else "won only from "
            at = rows[-1 if first is None else first]["skippable"]
            return "sdpa", (f"a mask leaving {skippable:.0%} of the tiles empty; the compiled kernel {least}"
                            f"{at:.0%} empty ({where})")
        return None


Steps = tuple[tuple[Optional[int], Optional[str], str], ...]


def step_choice(steps: Steps, scores) -> Optional[tuple[str, str]]:
    """(winner, why) of the first step whose bound holds ``scores`` (L * S; symbolic in a torch.compile graph,
    where each comparison becomes a guard); None without steps or where that step is a tie."""
    for bound, win, why in steps:
        if bound is None or scores <= bound:
            return None if win is None else (win, why)
    return None


@torch.compiler.assume_constant_result
def current_plain_steps(dtype: str, causal: bool, grad: bool) -> Steps:
    """``current_profile().plain_steps(...)``, () without a profile: a constant to torch.compile, which cannot
    call the profile's methods inside a graph."""
    prof = _read_profile()
    return () if prof is None else prof.plain_steps(dtype, causal, grad)


_loaded: dict[object, Optional[Profile]] = {}
# os.environ.get raises and catches two KeyErrors for a name that is not set (2 us; auto asks on every decision,
# issue #29). CPython keeps the environment in os.environ._data under encoded names: read there, with the
# mapping's own encodekey; elsewhere, os.environ.get.
_RAW = getattr(os.environ, "_data", None) if hasattr(os.environ, "encodekey") else None
_NAMES = {}


def _env(name: str):
    """The raw (encoded) value of the environment variable ``name``, or None where it is not set: a key, not
    a value to show (``os.environ.decodevalue`` decodes it)."""
    if _RAW is None:
        return os.environ.get(name)
    key = _NAMES.get(name)
    if key is None:
        key = _NAMES[name] = os.environ.encodekey(name)
    return _RAW.get(key)


def _decoded(raw) -> str:
    """The text of a value ``_env`` returned."""
    return raw if _RAW is None else os.environ.decodevalue(raw)


def current_profile() -> Optional[Profile]:
    """This machine's profile, read once per process and key (None if absent, off, or unreadable: a warning
    says why). Asked on every auto decision: what can change in a process (the thread count, the cache
    directory's variables) is the look-up key, so the file is hashed and read only the first time. Inside a
    torch.compile graph it is a constant, read when the graph is traced (``_traced_profile``)."""
    return _traced_profile() if torch.compiler.is_compiling() else _read_profile()


def _read_profile() -> Optional[Profile]:
    off = _env("ATTNLAB_PROFILE")
    if off is not None and _decoded(off).lower() in ("off", "0", "no"):
        return None
    where = (torch.get_num_threads(), _env("ATTNLAB_CACHE_DIR"), _env("XDG_CACHE_HOME"), _env("HOME"))
    cached = _loaded.get(where, False)
    if cached is not False:
        return cached
    path = profile_path()
    prof = None
    if path.is_file():
        try:
            data = json.loads(path.read_text())
            if data.get("key") != machine_key():
                raise ValueError("its machine key differs from this machine's")
            prof = Profile.from_json(data, path)
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("attnlab: ignoring the speed profile %s (%s); `attnlab tune` writes a new one", path, e)
    _loaded[where] = prof
    return prof


@torch.compiler.assume_constant_result
def _traced_profile() -> Optional[Profile]:
    """``current_profile()`` run, not traced, by torch.compile: the thread count and the file are not graph ops
    (torch.get_num_threads returns no tensor: an error under fullgraph=True). A graph keeps the profile it was
    traced with, as it keeps auto's choice; ``torch._dynamo.reset()`` traces again. (Not ``current_profile``:
    is_compiling() is still true while torch.compile runs it.)"""
    return _read_profile()


def save_profile(plain: list[dict], masked: list[dict], extra: Optional[dict] = None) -> Path:
    """Write this machine's profile (atomically: a reader sees the old file or the new one) and return its path."""
    key = machine_key()
    path = profile_path(key)
    data = {"version": PROFILE_VERSION, "key": key,
            "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "plain": plain, "masked": masked, **(extra or {})}
    Profile.from_json(data, path)                         # never write a profile this module would refuse
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
    _loaded.clear()                                       # this process reads the new file from now on
    return path


def forget_profile() -> Optional[Path]:
    """Remove this machine's profile (``attnlab tune --forget``); its path if there was one."""
    path = profile_path()
    _loaded.clear()
    if path.is_file():
        path.unlink()
        return path
    return None

"""A folder that behaves as a cgroup v2 hierarchy where the emulated cluster touches it,
the kernel's rules enforced: code that breaks them fails here as it would on a host.

``FakeCgroupV2(root, monkeypatch)`` makes the hierarchy's root group under ``root``;
``group("a/b", pids)`` makes groups and puts processes in them. While it lives (the test),
``Path.mkdir``, ``Path.rmdir``, ``Path.write_text`` and ``Path.read_text`` under ``root``
act as on cgroupfs (every other path as ever):

- ``mkdir``: a group with its interface files, and those of each controller that its
  parent's ``cgroup.subtree_control`` enables (``cpu.max``, ``memory.max``, ...).
- ``rmdir``: EBUSY while the group holds a process or a group.
- ``cgroup.subtree_control``: ``+c`` / ``-c``. ENOENT for a controller the group is not
  offered; EBUSY for ``+c`` while the group (not the root) holds a process, the "no
  internal processes" rule; EBUSY for ``-c`` while a child enables it for its own children.
- ``cgroup.procs``: moves the process from wherever it is; ESRCH for one that does not
  exist; EBUSY into a group (not the root) whose children use controllers.
- ``cgroup.kill``: SIGKILL to every process of the group and its descendants.
- any other file: written only where the kernel has it (ENOENT, as when the controller is
  not enabled); reading ``cgroup.procs`` lists live processes only.

A pid above ``PID_LIMIT`` stands for a process that exists and never exits (a shell
beside the cluster in its session); others are real processes.
"""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

PID_LIMIT = 4_194_304
"""The kernel's largest ``pid_max``: no real process has a pid above it."""
_FILES = {
    "": {"cgroup.procs": "", "cgroup.subtree_control": "", "cgroup.kill": "", "cgroup.events": ""},
    "cpu": {"cpu.max": "max 100000\n", "cpu.stat": "usage_usec 0\n"},
    "memory": {
        "memory.max": "max\n",
        "memory.swap.max": "max\n",
        "memory.peak": "0\n",
        "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
    },
}
_MKDIR, _RMDIR, _WRITE, _READ = Path.mkdir, Path.rmdir, Path.write_text, Path.read_text


def _alive(pid: int) -> bool:
    if pid > PID_LIMIT:
        return True
    try:
        stat = _READ(Path(f"/proc/{pid}/stat"))
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"  # a zombie has left its group


def _fail(code: int, path: Path) -> OSError:
    return OSError(code, os.strerror(code), str(path))


class FakeCgroupV2:
    """A cgroup v2 hierarchy under ``root`` (its root group offers cpu and memory)."""

    def __init__(self, root: Path, monkeypatch, offered: str = "cpuset cpu io memory pids"):
        self.root = root
        self.killed: list[int] = []
        """The pids that ``cgroup.kill`` ended."""
        _MKDIR(root, parents=True)
        for name, text in _FILES[""].items():
            _WRITE(root / name, text)
        _WRITE(root / "cgroup.controllers", offered + "\n")
        fake = self
        for name, method in (
            ("mkdir", self._mkdir),
            ("rmdir", self._rmdir),
            ("write_text", self._write),
            ("read_text", self._read),
        ):
            original = getattr(Path, name)

            def patched(path, *args, _original=original, _method=method, **kwargs):
                if fake._inside(path):
                    return _method(Path(path), *args, **kwargs)
                return _original(path, *args, **kwargs)

            monkeypatch.setattr(Path, name, patched)

    def group(self, relative: str, pids: list[int] = ()) -> Path:
        """Makes the group ``relative`` holding ``pids``, offered cpu and memory: each
        group above it hands them down (as systemd sets up the slices above a scope)."""
        path = self.root / relative
        for above in reversed([path, *path.parents]):
            if above != path and above.is_relative_to(self.root):
                above.mkdir(exist_ok=True)
                (above / "cgroup.subtree_control").write_text("+cpu +memory")
        path.mkdir(exist_ok=True)
        for pid in pids:
            (path / "cgroup.procs").write_text(str(pid))
        return path

    def procs(self, group: Path) -> list[int]:
        return [int(p) for p in (group / "cgroup.procs").read_text().split()]

    def _inside(self, path) -> bool:
        return Path(path).is_relative_to(self.root)

    def _groups(self) -> list[Path]:
        return [self.root, *(p for p in self.root.rglob("*") if p.is_dir())]

    def _enabled(self, group: Path) -> list[str]:
        return _READ(group / "cgroup.subtree_control").split()

    def _mkdir(self, path: Path, mode=0o777, parents=False, exist_ok=False) -> None:
        if path.is_dir():
            if exist_ok:
                return
            raise FileExistsError(errno.EEXIST, "File exists", str(path))
        if parents and not path.parent.exists():
            self._mkdir(path.parent, parents=True)
        _MKDIR(path)
        enabled = self._enabled(path.parent)
        for controller in ["", *enabled]:
            for name, text in _FILES.get(controller, {}).items():
                _WRITE(path / name, text)
        _WRITE(path / "cgroup.controllers", " ".join(enabled) + "\n")

    def _rmdir(self, path: Path) -> None:
        if self.procs(path) or any(p.is_dir() for p in path.iterdir()):
            raise _fail(errno.EBUSY, path)
        for f in path.iterdir():
            f.unlink()
        _RMDIR(path)

    def _read(self, path: Path, *args, **kwargs) -> str:
        text = _READ(path, *args, **kwargs)
        if path.name != "cgroup.procs":
            return text
        return "".join(f"{p}\n" for p in text.split() if _alive(int(p)))

    def _write(self, path: Path, text: str, *args, **kwargs) -> int:
        group = path.parent
        if not path.exists():  # cgroupfs makes no files: the kernel has it or it does not
            raise _fail(errno.ENOENT, path)
        if path.name == "cgroup.subtree_control":
            self._control(group, text.split())
        elif path.name == "cgroup.procs":
            self._move(group, int(text))
        elif path.name == "cgroup.kill":
            for g in [group, *(p for p in group.rglob("*") if p.is_dir())]:
                for pid in self.procs(g):
                    if pid <= PID_LIMIT:
                        os.kill(pid, signal.SIGKILL)
                    self.killed.append(pid)
                _WRITE(g / "cgroup.procs", "")
        else:
            _WRITE(path, text)
        return len(text)

    def _control(self, group: Path, tokens: list[str]) -> None:
        enabled = self._enabled(group)
        offered = _READ(group / "cgroup.controllers").split()
        children = [p for p in group.iterdir() if p.is_dir()]
        for token in tokens:
            sign, name = token[0], token[1:]
            if name not in offered:
                raise _fail(errno.ENOENT, group / "cgroup.subtree_control")
            if sign == "+" and name not in enabled:
                if group != self.root and self.procs(group):
                    raise _fail(errno.EBUSY, group / "cgroup.subtree_control")
                enabled.append(name)
                for child in children:
                    for file, text in _FILES[name].items():
                        _WRITE(child / file, text)
            elif sign == "-" and name in enabled:
                if any(name in self._enabled(child) for child in children):
                    raise _fail(errno.EBUSY, group / "cgroup.subtree_control")
                enabled.remove(name)
                for child in children:
                    for file in _FILES[name]:
                        (child / file).unlink()
        _WRITE(group / "cgroup.subtree_control", " ".join(enabled) + "\n" if enabled else "")
        for child in children:
            _WRITE(child / "cgroup.controllers", " ".join(enabled) + "\n")

    def _move(self, target: Path, pid: int) -> None:
        if target != self.root and self._enabled(target):
            raise _fail(errno.EBUSY, target / "cgroup.procs")
        holders = [g for g in self._groups() if pid in self.procs(g)]
        if not holders and not _alive(pid):
            raise ProcessLookupError(errno.ESRCH, os.strerror(errno.ESRCH))
        for g in holders:
            _WRITE(g / "cgroup.procs", "".join(f"{p}\n" for p in self.procs(g) if p != pid))
        _WRITE(target / "cgroup.procs", "".join(f"{p}\n" for p in [*self.procs(target), pid]))

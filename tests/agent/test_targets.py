from __future__ import annotations

import os
from pathlib import Path

from ember import abi
from ember.agent.targets import TargetResolver, cgroup2_root
from ember.config import Targets


def fake_proc(root: Path, pid: int, comm: str, exe: str) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "comm").write_text(comm + "\n")
    os.symlink(exe, d / "exe")


def test_whole_host() -> None:
    r = TargetResolver(Targets()).resolve()
    assert r.filter == 0 and not r.pids and not r.cgroups


def test_pids_comm_and_exe(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    fake_proc(proc, 10, "nginx", "/usr/sbin/nginx")
    fake_proc(proc, 11, "nginx-worker", "/usr/sbin/nginx")
    fake_proc(proc, 12, "postgres", "/usr/lib/postgresql/15/bin/postgres")
    fake_proc(proc, 13, "bash", "/bin/bash")
    (proc / "self").mkdir()
    r = TargetResolver(Targets(pids=(99,), comm=("^nginx$",), exe=("postgresql",)), proc).resolve()
    assert r.pids == {99, 10, 12}
    assert r.filter == abi.FILTER_PIDS


def test_cgroup_subtrees_by_inode(tmp_path: Path) -> None:
    fs = tmp_path / "cgroup"
    (fs / "system.slice/app.service/child").mkdir(parents=True)
    (fs / "system.slice/other.service").mkdir(parents=True)
    r = TargetResolver(Targets(cgroups=("/system.slice/app.service", "/missing")), tmp_path,
                       fs).resolve()
    want = {os.stat(fs / "system.slice/app.service").st_ino,
            os.stat(fs / "system.slice/app.service/child").st_ino}
    assert r.cgroups == want and r.filter == abi.FILTER_CGROUPS


def test_cgroup2_root(tmp_path: Path) -> None:
    m = tmp_path / "mounts"
    m.write_text("tmpfs /sys/fs/cgroup tmpfs rw 0 0\n"
                 "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n")
    assert cgroup2_root(m) == Path("/sys/fs/cgroup/unified")
    assert cgroup2_root(tmp_path / "none") == Path("/sys/fs/cgroup")

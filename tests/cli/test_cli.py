"""The command line: bad input gives one clear line on stderr and exit
status 2, before any BPF (a COMMAND that does not exist is never started);
record's flags are perf's and py-spy's, with durations in units; binary
pprof is refused to a terminal; the parser has every command of the
registry; --mode lists every profile kind; messages of symbolize and
query, and query pointed at a collector's gRPC port."""

from __future__ import annotations

import argparse
import json
import os
import pty
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ember import model
from ember.cli import COMMANDS, build_parser
from ember.httpserve import Reply, serve

EMBER = [sys.executable, "-m", "ember.cli"]


def run(*args: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [*EMBER, *args]
    if user:
        cmd = ["setpriv", f"--reuid={user}", "--regid=65534", "--clear-groups",
               "--inh-caps=-all", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})


@pytest.mark.parametrize(("args", "message"), [
    (["--frequency", "0"], "--frequency must be between 1 and"),
    (["--frequency", "abc"], "not an integer: 'abc'"),
    (["--pid", "999999999"], "no process with PID 999999999"),
    (["--pid", "-3"], "no process with PID -3"),
    (["--duration", "-1"], "--duration must be positive"),
    (["-d", "0s"], "--duration must be positive"),
    (["-d", "3x"], "argument --duration/-d: not a duration: '3x'"),
    (["-F", "0"], "--frequency must be between 1 and"),
    (["-p", "999999999"], "no process with PID 999999999"),
    (["--", "ember-no-such-command"], "command not found: ember-no-such-command"),
    (["--mode", "gpu"], "invalid choice: 'gpu'"),
    (["--output", "/nonexistent-dir/out.folded"], "directory /nonexistent-dir does not exist"),
    (["--output", "/"], "it is a directory"),
    (["--mode", "offcpu", "--min-block-us", "100", "--max-block-us", "10"],
     "--max-block-us 10 is below --min-block-us 100"),
    (["--state", "4096"], "--state must be a mask"),
    (["--no-kernel-stacks", "--no-user-stacks"], "at least one of user and kernel stacks"),
])
def test_bad_input(args: list[str], message: str) -> None:
    r = run("record", *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stdout == ""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root to drop to an unprivileged user")
def test_missing_privilege_names_the_capability() -> None:
    r = run("record", "--duration", "1", user="nobody")
    assert r.returncode == 2, r.stderr
    assert "CAP_BPF and CAP_PERFMON" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to an unprivileged user")
def test_unreadable_output_directory(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    r = run("record", "--output", str(locked / "sub" / "x"), user="nobody")
    assert r.returncode == 2 and "cannot write" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_help_lists_record() -> None:
    r = run("--help")
    assert r.returncode == 0 and "record" in r.stdout


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_parser_has_every_command_of_the_registry() -> None:
    parsers = subcommands(build_parser())
    assert list(parsers) == [c.name for c in COMMANDS]
    assert len(set(parsers)) == len(COMMANDS)
    for command in COMMANDS:
        assert parsers[command.name].get_default("run") is command.run
    r = run("--help")
    assert all(c.name in r.stdout and c.help in " ".join(r.stdout.split()) for c in COMMANDS)


def test_record_help_lists_every_profile_kind() -> None:
    r = run("record", "--help")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())  # argparse wraps lines
    assert "{" + ",".join(model.KIND_NAMES) + "}" in text
    for kind in model.PROFILE_KINDS:
        assert f"{kind.name}: {kind.help}" in text
    assert f"(default {model.CPU.name})" in text
    mode = subcommands(build_parser())["record"].parse_args([])
    assert mode.mode == model.CPU.name


def test_help_imports_no_heavy_module() -> None:
    code = ("import sys\nfrom ember.cli import main\ntry:\n    main(['record', '--help'])\n"
            "except SystemExit:\n    pass\n"
            "print(' '.join(m for m in ('grpc', 'bcc', 'numpy', 'yaml', 'prometheus_client', "
            "'ember.record', 'ember.httpserve') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == ""


def test_symbolize_checks_the_process_before_reading_stdin() -> None:
    # stdin stays open: a command that read it first would wait forever
    p = subprocess.Popen([*EMBER, "symbolize", "--pid", "999999999"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        status = p.wait(timeout=60)
    finally:
        p.kill()
        out, err = p.communicate()
    assert status == 2 and out == ""
    assert err == ("ember symbolize: no process with PID 999999999 "
                   "(or its maps are not readable)\n")
    r = run("symbolize", "--pid", str(os.getpid()), "10", "zz")
    assert r.returncode == 2 and r.stderr == "ember symbolize: not a hex address: 'zz'\n"


def answer(path: str, query: dict[str, list[str]], auth: str) -> Reply:
    if query.get("since") == ["1h"] and query.get("match") == ["pid=7"] and auth == "Bearer t":
        return 200, b"app;main 5\n", "text/plain"
    return 400, json.dumps({"error": f"bad query {sorted(query.items())}"}).encode(), \
        "application/json"


def test_query_output_and_messages(tmp_path: Path) -> None:
    server = serve("127.0.0.1:0", answer, "test")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    token = tmp_path / "token"
    token.write_text("t\n")
    try:
        r = run("query", "--collector", url + "/", "--match", "pid=7", "--token-file", str(token),
                "-o", str(tmp_path / "out.folded"))
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert (tmp_path / "out.folded").read_text() == "app;main 5\n"
        r = run("query", "--collector", url, "--since", "2h")
        assert r.returncode == 1 and r.stderr.startswith("ember query: collector answered 400: "
                                                         "bad query [('format', ['folded'])")
    finally:
        server.shutdown()
        server.server_close()
    r = run("query", "--collector", url)
    assert r.returncode == 1 and r.stderr.startswith(f"ember query: cannot reach {url}: ")
    r = run("query", "--collector", url, "--match", "pid")
    assert r.returncode == 2 and r.stderr == (
        "ember query: --match must be LABEL=VALUE (or !=, =~, !~), not 'pid'\n")
    r = run("query", "--collector", url, "--token-file", str(tmp_path / "none"))
    assert r.returncode == 2 and "cannot read token file" in r.stderr


def test_every_flag_is_in_the_readme() -> None:
    """A flag added to a command without a word in the README fails here."""
    from ember.cli import COMMANDS, build_parser
    from tests.support import ROOT

    readme = (ROOT / "README.md").read_text()
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    missing = []
    for command in COMMANDS:
        p = sub.choices[command.name]  # type: ignore[index]
        for action in p._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help" and flag not in readme:
                    missing.append(f"ember {command.name} {flag}")
    assert not missing, missing


@pytest.mark.parametrize("command", [["flamegraph", "x.folded"], ["diff", "a.folded", "b.folded"]])
def test_width_floor(command: list[str]) -> None:
    r = run(*command, "--width", "50")
    assert r.returncode == 2 and "--width must be at least 100" in r.stderr


def test_record_flags_are_perf_and_py_spy_flags() -> None:
    record = subcommands(build_parser())["record"]
    a = record.parse_args(["-p", "1", "-p", "2", "-F", "499", "-o", "out.folded", "-d", "2m",
                           "--", "python3", "-c", "pass", "-d", "--", "x"])
    assert (a.pid, a.frequency, a.output, a.duration) == ([1, 2], 499, "out.folded", 120.0)
    assert a.workload == ["python3", "-c", "pass", "-d", "--", "x"]  # all COMMAND's
    top = build_parser().parse_args(["record", "-o", "x", "--", "sleep", "1"])
    assert top.command == "record" and top.workload == ["sleep", "1"]  # error messages name it
    for text, seconds in (("10s", 10.0), ("500ms", 0.5), ("3", 3.0), ("1.5", 1.5),
                          ("1h", 3600.0)):
        assert record.parse_args(["--duration", text]).duration == seconds
    assert record.parse_args(["--delimiter"]).delimiter
    assert not record.parse_args([]).delimiter and record.parse_args([]).workload == []
    dump = subcommands(build_parser())["dump"]
    assert dump.parse_args(["--watch", "2s"]).watch == 2.0
    assert dump.parse_args(["--watch", "250ms"]).watch == 0.25
    r = run("record", "--help")
    text = " ".join(r.stdout.split())
    assert "usage: ember record [OPTIONS] [-- COMMAND [ARG ...]]" in text
    assert "-d is --duration, as in py-spy" in text and "is --delimiter" in text
    assert "--duration DURATION, -d DURATION" in text


def test_a_command_that_cannot_run_is_never_started(tmp_path: Path) -> None:
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\ntouch started\n")
    script.chmod(0o644)
    r = subprocess.run([*EMBER, "record", "--", str(script)], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == f"ember record: cannot run {script}: permission denied\n"
    assert list(tmp_path.iterdir()) == [script]  # no output file, nothing started


def test_dump_watch_takes_a_duration() -> None:
    r = run("dump", "--watch", "3x")
    assert r.returncode == 2 and "argument --watch: not a duration: '3x'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = run("dump", "--watch", "-1")
    assert r.returncode == 2 and r.stderr == "ember dump: --watch cannot be negative, not -1\n"


def test_binary_pprof_is_refused_to_a_terminal() -> None:
    """Checked before any BPF: ember's standard output is a terminal."""
    main_fd, sub_fd = pty.openpty()
    try:
        r = subprocess.run([*EMBER, "record", "--format", "pprof", "-d", "1s"], stdout=sub_fd,
                           stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(sub_fd)
        os.close(main_fd)
    assert r.returncode == 2
    assert r.stderr == "ember record: pprof output is binary: give --output FILE or " \
                       "redirect stdout\n"


def test_query_at_the_grpc_port_is_one_line(tmp_path: Path) -> None:
    """The collector's gRPC port speaks HTTP/2 only: one line, not a
    BadStatusLine traceback; the same for a port where nothing listens."""
    from ember.collector.server import Collector
    from ember.config import CollectorConfig
    from tests.support.net import free_port

    c = Collector(CollectorConfig(grpc_listen="127.0.0.1:0", http_listen="127.0.0.1:0",
                                  storage=str(tmp_path / "db.sqlite")))
    c.start()
    try:
        grpc = f"http://127.0.0.1:{c.grpc_port}"
        r = run("query", "--collector", grpc)
        assert r.returncode == 1 and r.stdout == ""
        assert r.stderr == (f"ember query: cannot reach {grpc}: it does not answer HTTP "
                            "(a gRPC port?)\n")
    finally:
        c.close()
    closed = f"http://127.0.0.1:{free_port()}"
    r = run("query", "--collector", closed)
    assert r.returncode == 1 and r.stderr.startswith(f"ember query: cannot reach {closed}: ")
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr

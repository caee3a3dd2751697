"""The loader on hostile input: anything either loads or is one ConfigError
reading ``FILE:LINE: KEY: problem``, quickly and in bounded memory. Random
text, mutations of the documented config/ember.yaml and YAML dumped from
random trees (10,000 inputs, derandomized so CI is reproducible), then one
example for each kind of input that once crashed, hung, blew up or was
wrongly accepted."""

from __future__ import annotations

import re
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember import config
from ember.config.load import MAX_NODES, MAX_TEXT
from ember.config.options import keys_of
from ember.errors import ConfigError
from tests.support import ROOT
from tests.support.bounds import no_hang

MESSAGE = re.compile(r"^f\.yaml:\d+: [\w.()\[\] -]+: .+")


def fuzz(examples: int) -> Any:
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def check(text: str) -> None:
    """The property: a Config, or a one-line ConfigError naming file, line
    and key; nothing else, and never a hang."""
    with no_hang(text[:200]):
        try:
            assert isinstance(config.loads(text, "f.yaml"), config.Config)
        except ConfigError as exc:
            message = str(exc)
            assert MESSAGE.match(message) and "\n" not in message, message


def dotted_keys(cls: type[Any], prefix: str) -> list[str]:
    out = []
    for key in keys_of(cls):
        name = f"{prefix}.{key.name}" if prefix else key.name
        out.append(name)
        if key.section is not None:
            out.extend(dotted_keys(key.section, name))
    return out


KEYS = dotted_keys(config.Config, "")
NAMES = sorted({k.rsplit(".", 1)[-1] for k in KEYS})

#: YAML that has broken the loader, or nearly: a value in place of any other.
NASTY = [
    "", "~", "[]", "{}", "[1, 2]", "{a: b}", "[x, [y]]", "-1", "-0", "0", "-0.0", "1e309",
    "1.0e309", ".nan", ".NaN", ".inf", "-.inf", "9" * 60, "0x" + "f" * 60, "1:2:3:4:5:6",
    "10s", "-5s", "1e400s", "9999999999999h", "0.5ms", "'1 fortnight'", "256MiB",
    "99999999999999999999TiB", "'٣s'", "true", "yes", "null", "!foo x", "!foo {a: b}",
    '!!python/object/apply:os.system ["true"]', "!!python/name:os.system", "!!binary aGVsbG8=",
    "!!set {a}", "!!omap [{a: b}]", "!!bool maybe", "!!int x", "!!timestamp x", "!!float 1",
    "!!str 5", "! 5", "&x [1, 2]", "*x", "*undefined", "{<<: {a: b}}", '"\\0"', '"\\ud800"',
    '"\\x01"', "'" + "a" * 3000 + "'", "'('", "'(a+)+$'", "'(?i)x'", "'a{99999999999}'",
    "['" + "(" * 2000 + ")" * 2000 + "']", "2020-02-30", "2020-01-01", "':٣'", "':0'",
    "':65536'", "'[::1]:80'", "'a b:80'", "[{source_labels: [a], regex: '(', action: keep}]",
    "[{action: replace}]", "[{1: 2, zz: 3}]", "[{regex: '(?i)x', action: labeldrop}]",
    "{[a]: b}", "{a: 1, a: 2}", "{__x: y}", "{a: .nan}", "[" * 40 + "]" * 40,
    "{a: " * 40 + "1" + "}" * 40, "|\n  block", ">-\n  folded", "[cpu, disk]", "[writeraw]",
]
#: Lines and fragments to insert: YAML structure, directives, odd characters.
FRAGMENTS = [
    "---", "...", "%YAML 1.1", "%TAG ! tag:x,2000:", "? [a]", ": x", "- x", "<<: *x", "&x",
    "\t", "\ufeff", "\x00", "\x01", "\x85", "\u2028", "\r", "#", "'", '"', "{", "}", "[", "]",
    ",", "!", "|", ">", "@", "`", "%",
]


@st.composite
def mutated(draw: st.DrawFn) -> str:
    """config/ember.yaml (its comments dropped, for speed) after 1 to 4 edits."""
    lines = list(BASE)
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["delete", "duplicate", "indent", "value", "insert",
                                   "swap", "splice"]))
        line = lines[i]
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, line)
        elif op == "indent":
            lines[i] = draw(st.sampled_from(["", " ", "  ", "    ", "\t", "   "])) + line.lstrip()
        elif op == "value":
            head = line.split(":", 1)[0] if ":" in line else line
            lines[i] = f"{head}: {draw(st.sampled_from(NASTY) | st.text(max_size=30))}"
        elif op == "insert":
            indent = draw(st.sampled_from(["", "  ", "    "]))
            key = draw(st.sampled_from(NAMES))
            lines.insert(i, f"{indent}{key}: {draw(st.sampled_from(NASTY))}")
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], line
        else:
            at = draw(st.integers(0, len(line)))
            lines[i] = line[:at] + draw(st.sampled_from(FRAGMENTS)) + line[at:]
        if not lines:
            break
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n---\n", "\n...\n"]))


BASE = [line for line in (ROOT / "config/ember.yaml").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")]

_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12),
    st.sampled_from(NAMES), st.sampled_from(["10s", "1e400s", "-0", "64MiB", ":80", "(", "cpu"]))
_TREES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(max_size=6) | st.sampled_from(NAMES), inner, max_size=4),
        # one object used several times: the dump writes an anchor and aliases
        st.builds(lambda tree, n: [tree] * n, inner, st.integers(2, 9))),
    max_leaves=24)


@st.composite
def trees(draw: st.DrawFn) -> str:
    """A random value at a random key of the schema, dumped as YAML."""
    doc: Any = draw(_TREES)
    for part in reversed(draw(st.sampled_from(KEYS)).split(".")):
        doc = {part: doc}
    flow = draw(st.sampled_from([None, True, False]))
    return yaml.safe_dump(doc, default_flow_style=flow, allow_unicode=draw(st.booleans()))


_TOKENS = st.sampled_from(
    ["agent", "collector", "targets", "relabel", "labels", "interval", "pids", ":", ": ",
     "\n", "\n  ", "\n    ", "- ", "[", "]", "{", "}", ",", "&a ", "*a", "!foo ", "!!str ",
     "'", '"', "#", "<<", "? ", "---\n", "|\n", "1", "-1", ".nan", "10s", "x", "\t", "\\"])


@fuzz(3000)
@given(st.text(max_size=120) | st.lists(_TOKENS | st.characters(), max_size=60).map("".join))
def test_any_text(text: str) -> None:
    check(text)


@fuzz(4000)
@given(mutated())
def test_mutations_of_the_documented_config(text: str) -> None:
    check(text)


@fuzz(3000)
@given(trees())
def test_random_values_at_every_key(text: str) -> None:
    check(text)


def billion_laughs(key_path: str) -> str:
    """Nine levels of nine aliases each (9**9 values) in ~400 bytes, at a key."""
    levels = ['&a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    levels += [f"&{name} [" + ",".join([f"*{prev}"] * 9) + "]"
               for prev, name in zip("abcdefgh", "bcdefghi", strict=True)]
    head, _, last = key_path.rpartition(".")
    lines = [f"{'  ' * depth}{part}:" for depth, part in enumerate(head.split("."))]
    lines.append(f"{'  ' * len(lines)}{last}: [" + ", ".join(levels) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("key", ["agent.labels", "agent.debug_dirs", "agent.relabel",
                                 "agent.targets.comm", "agent.interval"])
def test_alias_bomb_is_refused_at_once(key: str) -> None:
    text = billion_laughs(key)
    assert len(text) < 600
    tracemalloc.start()
    try:
        refused = rf"^f\.yaml:\d+: {re.escape(key)}: more than {MAX_NODES} values"
        with no_hang(text), pytest.raises(ConfigError, match=refused):
            config.loads(text, "f.yaml")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 << 20, peak


@pytest.mark.parametrize(("text", "message"), [
    # tags other than the plain types were a ConstructorError traceback (exit 1),
    # and killed the agent on SIGHUP
    ("agent:\n  interval: !foo 10s\n", "f.yaml:2: agent.interval: unsupported YAML tag !foo"),
    ('agent:\n  cpu: !!python/object/apply:os.system ["true"]\n',
     "f.yaml:2: agent.cpu: unsupported YAML tag !!python/object/apply:os.system"),
    ("agent:\n  unwinder: !!binary aGVsbG8=\n", "agent.unwinder: unsupported YAML tag !!binary"),
    ("agent:\n  labels: !!set {a}\n", "agent.labels: unsupported YAML tag !!set"),
    ("agent: !foo {}\n", "f.yaml:1: agent: unsupported YAML tag !foo"),
    ("agent:\n  !foo cpu: true\n", "f.yaml:2: agent: unsupported YAML tag !foo"),
    # merge keys: a ConstructorError traceback
    ("agent:\n  <<: {cpu: true}\n", "f.yaml:2: agent: merge keys (<<) are not supported"),
    ("agent:\n  labels: {<<: {a: b}}\n", "agent.labels: merge keys (<<) are not supported"),
    # an explicit tag on text it does not fit: KeyError and other tracebacks
    ("agent:\n  cpu: !!bool maybe\n", "f.yaml:2: agent.cpu: 'maybe' is not a valid !!bool"),
    ("agent:\n  frequency: !!int x\n", "agent.frequency: 'x' is not a valid !!int"),
    ("agent:\n  kubernetes:\n    node_name: !!timestamp x\n",
     "f.yaml:3: agent.kubernetes.node_name: 'x' is not a valid !!timestamp"),
    ("agent:\n  kubernetes:\n    node_name: 2020-02-30\n",
     "agent.kubernetes.node_name: '2020-02-30': day is out of range"),
    # a list or mapping as a key inside a value: "found unhashable key" traceback
    ("agent:\n  labels: {[a]: b}\n", "f.yaml:2: agent.labels: a key must be a name, not ['a']"),
    ("agent:\n  relabel:\n    - {[a]: 1}\n", "f.yaml:3: agent.relabel: a key must be a name"),
    # keys of several types in a rule: sorting them was a TypeError traceback
    ("agent:\n  relabel:\n    - {1: 2, zz: 3}\n", "agent.relabel: rule 1: unknown key 1"),
    # duplicate keys inside a value: the last silently won
    ("agent:\n  labels: {a: x, a: y}\n", "f.yaml:2: agent.labels: duplicate key 'a'"),
    # deep nesting: seconds in the scanner, then a RecursionError traceback
    ("agent: " + "[" * 3000 + "]" * 3000 + "\n", "f.yaml:1: (yaml): nested more than 32 deep"),
    ("agent:\n  labels: " + "{a: " * 100 + "1" + "}" * 100 + "\n", "(yaml): nested more than"),
    # non-finite durations: NaN passed every range check and crashed int(x * 1e9)
    ("agent:\n  interval: .nan\n", "f.yaml:2: agent.interval: not a finite duration: nan"),
    ("agent:\n  offcpu_sample: .NaN\n", "agent.offcpu_sample: not a finite duration"),
    ("agent:\n  max_block: .inf\n", "agent.max_block: not a finite duration: inf"),
    # huge numbers: int() refuses 4300 digits (a traceback as a key), float() of
    # a big int overflows (traceback), a long sexagesimal int is slow
    ("agent:\n  frequency: " + "9" * 5000 + "\n",
     "f.yaml:2: agent.frequency: a number of more than 40 characters"),
    ("agent:\n  interval: 0x" + "f" * 300 + "\n", "agent.interval: a number of more than 40"),
    ("agent:\n  ? " + "9" * 5000 + "\n  : 1\n", "f.yaml:2: agent: a number of more than 40"),
    ("agent:\n  frequency: " + ":".join(["59"] * 3000) + "\n", "a number of more than 40"),
    # values past what C and the kernel hold were accepted
    ("agent:\n  spool_max_size: 99999999999999999999TiB\n",
     "agent.spool_max_size: '99999999999999999999TiB' is out of range [1048576, "
     "9223372036854775807]"),
    ("agent:\n  targets:\n    pids: [99999999999]\n",
     "f.yaml:3: agent.targets.pids: 99999999999 is larger than 2147483647"),
    # digits of other scripts: int() and \d take them, so ':٣' was port 3
    ("agent:\n  collector: ':٣'\n", "f.yaml:2: agent.collector: not HOST:PORT"),
    ("agent:\n  interval: '٣s'\n", "agent.interval: not a duration"),
    ("agent:\n  collector: 'a b:80'\n", "agent.collector: not HOST:PORT"),
    # regular expressions re.compile refuses with other exceptions (tracebacks),
    # or that are valid alone but not as relabeling compiles them (a crash later)
    ("agent:\n  targets:\n    comm: ['" + "(" * 5000 + ")" * 5000 + "']\n",
     "f.yaml:3: agent.targets.comm: bad regular expression"),
    ("agent:\n  targets:\n    exe: ['a{99999999999}']\n",
     "agent.targets.exe: bad regular expression 'a{99999999999}': the repetition number"),
    ("agent:\n  relabel:\n    - {source_labels: [a], regex: '(?i)prod', action: keep}\n",
     "agent.relabel: rule 1: bad regular expression '(?i)prod' (used as '^(?:(?i)prod)$')"),
    # NUL (Path() raises on it) and lone surrogates (no encoding takes them)
    ('agent:\n  spool_dir: "/a\\0b"\n', "f.yaml:2: agent.spool_dir: '/a\\x00b' holds a NUL"),
    ('agent:\n  labels: {a: "\\ud800"}\n', "agent.labels: '\\ud800' holds a NUL or a lone"),
    # errors without a line or a key
    ("agent:\n  cpu: true\x01\n", "f.yaml:2: (yaml): character U+0001 is not allowed in YAML"),
    ("agent: {}\n---\ncollector: {}\n", "f.yaml:2: (yaml): but found another document"),
    ("agent:\n  'a: b': 1\n", "f.yaml:2: agent: unknown key 'a: b' (known: "),
    ("agent:\n  labels: " + "x" * 2000 + "\n", "agent.labels: expected a mapping of label "),
])
def test_each_kind_of_bad_input_is_one_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        config.loads(text, "f.yaml")
    assert message in str(exc.value)
    assert MESSAGE.match(str(exc.value)) and len(str(exc.value)) < 500, str(exc.value)


def test_aliases_and_explicit_plain_tags_still_load() -> None:
    c = config.loads("agent:\n  targets:\n    comm: &c ['^a$']\n    exe: *c\n"
                     "  frequency: !!int '99'\n  offcpu_sample: !!float 0\n"
                     "  kubernetes:\n    node_name: !!str 2020-01-01\n", "f.yaml")
    assert c.agent.targets.exe == ("^a$",) and c.agent.frequency == 99
    assert c.agent.offcpu_sample == 0 and c.agent.kubernetes.node_name == "2020-01-01"


def test_too_long_text_is_refused_before_parsing() -> None:
    text = "agent:\n" + "# padding\n" * (MAX_TEXT // 10)
    with pytest.raises(ConfigError, match=r"^f\.yaml:\d+: \(yaml\): longer than"):
        config.loads(text, "f.yaml")


def test_a_file_that_is_not_utf8_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_bytes(b"agent:\n  kubernetes:\n    node_name: caf\xe9\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}:3: \(yaml\): not a text "
                                          r"file: byte 0xe9 is not UTF-8$"):
        config.load(path)

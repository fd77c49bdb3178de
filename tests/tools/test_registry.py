"""verl's tool file, verl-style tool classes, and running a batch's calls
with a bound and a deadline."""

from __future__ import annotations

import threading
import time
import types
import sys

import pytest

from thinkrl.tools.calls import ToolCall
from thinkrl.tools.registry import Tool, ToolRunner, load_tools, truncated
from thinkrl.tools.setup import tool_file


class VerlStyleEcho:
    """A tool written for verl: coroutines, an instance per call, (response, reward, metrics)."""

    instances: list[str] = []

    def __init__(self, config, tool_schema):
        self.config, self.name = config, tool_schema.function.name  # verl reads the schema so

    async def create(self, instance_id=None, **kwargs):
        VerlStyleEcho.instances.append("created")
        return "id-1", None

    async def execute(self, instance_id, parameters, **kwargs):
        return types.SimpleNamespace(text=f"echo {parameters['word']} {self.config['suffix']}"), 0.0, {}

    async def release(self, instance_id, **kwargs):
        VerlStyleEcho.instances.append("released")


@pytest.fixture
def echo_module(monkeypatch):
    module = types.ModuleType("echo_tools")
    module.VerlStyleEcho = VerlStyleEcho
    monkeypatch.setitem(sys.modules, "echo_tools", module)


def test_verl_tool_file_loads_native_and_verl_style_classes(tmp_path, echo_module):
    path = tmp_path / "tools.yaml"
    path.write_text("""
tools:
  - class_name: thinkrl.tools.calculator.Calculator
    config: {type: native}
  - class_name: echo_tools.VerlStyleEcho
    config: {type: native, suffix: "!"}
    tool_schema:
      type: function
      function: {name: echo, description: says it back, parameters: {type: object, properties: {}}}
""")
    tools = {t.name: t for t in load_tools(path)}
    assert set(tools) == {"calculator", "echo"}
    assert tools["calculator"].call({"expression": "2*21"}) == "42"
    assert tools["echo"].call({"word": "hi"}) == "echo hi !"
    assert VerlStyleEcho.instances[-2:] == ["created", "released"]
    assert tools["echo"].schema["function"]["description"] == "says it back"


@pytest.mark.parametrize("text, message", [
    ("tools: []", "non-empty `tools:` list"),
    ("tools:\n  - config: {type: native}", "needs class_name"),
    ("tools:\n  - class_name: no.such.Tool", "cannot import no.such.Tool"),
    ("tools:\n  - class_name: thinkrl.tools.calculator.Calculator\n    config: {type: mcp}",
     "only native tools"),
    ("tools:\n  - class_name: thinkrl.tools.calculator.Calculator\n"
     "  - class_name: thinkrl.tools.calculator.Calculator", "share a name"),
])
def test_a_bad_tool_file_names_the_entry_and_the_fix(tmp_path, text, message):
    path = tmp_path / "tools.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_tools(path)
    with pytest.raises(ValueError, match="no such file"):
        load_tools(tmp_path / "missing.yaml")


def test_builtin_tool_files_resolve_and_unknown_ones_are_listed():
    assert load_tools(tool_file("builtin:calculator"))[0].name == "calculator"
    assert load_tools(tool_file("builtin:python"))[0].name == "python"
    with pytest.raises(ValueError, match="builtin:calculator"):
        tool_file("builtin:abacus")


def test_the_runner_answers_every_call_within_its_deadline_and_bound():
    running, peak, lock = [0], [0], threading.Lock()

    def slow(arguments):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.2)
        with lock:
            running[0] -= 1
        return "done"

    def hang(arguments):
        time.sleep(30)
        return "never"

    def crash(arguments):
        raise RuntimeError("the tool broke")

    runner = ToolRunner([Tool("slow", {}, slow), Tool("hang", {}, hang), Tool("crash", {}, crash)],
                        concurrency=3, timeout_s=1.0)
    calls = [ToolCall("slow")] * 6 + [ToolCall("hang"), ToolCall("crash"), ToolCall("nope"),
                                      ToolCall("", error="the tool call is not valid JSON")]
    start = time.monotonic()
    outcomes = runner.run(calls)
    assert time.monotonic() - start < 4
    assert [o.text for o in outcomes[:6]] == ["done"] * 6 and peak[0] == 3
    assert outcomes[6].failed and "did not answer within 1 s" in outcomes[6].text
    assert outcomes[7].text == "error: RuntimeError: the tool broke"
    assert "there is no tool 'nope' (tools: slow, hang, crash)" in outcomes[8].text
    assert outcomes[9].text == "error: the tool call is not valid JSON"
    assert not any(o.failed for o in outcomes[:6])


def test_truncation_keeps_the_side_verl_keeps():
    text = "abcdefghij"
    assert truncated(text, 10, "middle") == text
    assert truncated(text, 4, "left") == "abcd...(truncated)"
    assert truncated(text, 4, "right") == "(truncated)...ghij"
    assert truncated(text, 4, "middle") == "ab...(truncated)...ij"

"""Reading tool calls (hermes) and the calculator tool."""

from __future__ import annotations

import pytest

from thinkrl.tools.calculator import Calculator, evaluate
from thinkrl.tools.calls import ToolCall, hermes_call, parse_tool_calls


def test_hermes_calls_are_read_in_order_with_their_arguments():
    text = ("let me compute " + hermes_call("calculator", {"expression": "12 + 30"}) + "\n"
            + '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}</tool_call>')
    assert parse_tool_calls(text) == [ToolCall("calculator", {"expression": "12 + 30"}),
                                      ToolCall("python", {"code": "print(1)"})]
    assert parse_tool_calls("no call here, <tool_call> unterminated") == []


@pytest.mark.parametrize("body, error", [
    ('{"name": "calculator", "arguments": {"expression": "1+', "not valid JSON"),
    ('["calculator"]', 'with a "name"'),
    ('{"name": "calculator", "arguments": 3}', '"arguments" must be a JSON object'),
])
def test_a_malformed_call_is_kept_with_what_is_wrong(body, error):
    (call,) = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert call.error is not None and error in call.error


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="multi_turn.format='xml'"):
        parse_tool_calls("", format="xml")


def test_the_calculator_is_exact_and_refuses_anything_but_arithmetic():
    tool = Calculator()
    assert tool.execute({"expression": "4821 + 3977 - 1265"}) == "7533"
    assert tool.execute({"expression": "(2 ** 70) * 3"}) == str(3 * 2 ** 70)
    assert tool.execute({"expression": "7 / 2"}) == "3.5"
    assert tool.execute({"expression": "-(6 // 4) % 5"}) == "4"
    for bad, message in [("__import__('os').system('ls')", "only numbers"), ("1 / 0", "division by zero"),
                         ("9 ** 9 ** 9", "too large"), ("2 +", "cannot read"), ("1" * 600, "longer than")]:
        with pytest.raises(ValueError, match=message):
            evaluate(bad)
    with pytest.raises(ValueError, match="expression"):
        tool.execute({"expr": "1"})

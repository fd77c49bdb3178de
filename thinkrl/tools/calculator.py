"""A calculator tool: exact arithmetic on an expression, no Python eval.

Integers are exact at any size (Python's); ``/`` gives a fraction shown as a
decimal; powers and results are bounded so that no call can take long."""

from __future__ import annotations

import ast
import operator

from thinkrl.errors import UserError

SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / // % ** and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string",
                                          "description": "for example (1234 + 5678) * 9"}},
            "required": ["expression"],
        },
    },
}
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_DIGITS = 1000
MAX_EXPRESSION = 500


def evaluate(expression: str) -> int | float:
    """The value of `expression`; ValueError saying what is wrong otherwise."""
    if len(expression) > MAX_EXPRESSION:
        raise UserError(f"the expression is longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise UserError(f"cannot read {expression!r} as arithmetic") from None
    return _value(tree.body)


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) * max(1, len(str(abs(int(left))))) > MAX_DIGITS:
            raise UserError("the power is too large")
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise UserError("division by zero")
        result = _BINARY[type(node.op)](left, right)
        if isinstance(result, int) and abs(result).bit_length() > 3.33 * MAX_DIGITS:
            raise UserError("the result is too large")
        return result
    raise UserError(f"only numbers, + - * / // % ** and parentheses are allowed, not "
                     f"{ast.unparse(node)!r}")


def shown(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


class Calculator:
    """``class_name: thinkrl.tools.calculator.Calculator`` in a tool file."""

    def __init__(self, config: dict | None = None, tool_schema: dict | None = None) -> None:
        self.schema = tool_schema or SCHEMA
        self.name = self.schema["function"]["name"]

    def execute(self, parameters: dict) -> str:
        expression = parameters.get("expression")
        if not isinstance(expression, str):
            raise UserError('give the expression as {"expression": "..."}')
        return shown(evaluate(expression))

"""Ordinary code a model writes for exact arithmetic and text runs in the
Python tool with the audit hook on (the default): the hook is a courtesy for
hostile code, never a wall against the standard library."""

from __future__ import annotations

import textwrap

import pytest

from thinkrl.tools.jail import jail_plan
from thinkrl.tools.sandbox import SandboxLimits, run_python

pytestmark = pytest.mark.skipif(bool(jail_plan().missing), reason="no kernel sandbox on this machine")

CORPUS = {
    "fractions": ("from fractions import Fraction\nprint(Fraction(1, 3) + Fraction(1, 6))", "1/2"),
    "decimal": ("from decimal import Decimal, getcontext\ngetcontext().prec = 30\n"
                "print(Decimal(1) / Decimal(7))", "0.142857142857142857142857142857"),
    "statistics": ("import statistics\nprint(statistics.mean([1, 2, 3, 4]), statistics.median([3, 1, 2]),"
                   " round(statistics.stdev([2, 4, 4, 4, 5, 5, 7, 9]), 4))", "2.5 2 2.1381"),
    "namedtuple": ("from collections import namedtuple\nP = namedtuple('P', 'x y')\nprint(P(1, 2).x + P(3, 4).y)",
                   "5"),
    "dataclasses": ("from dataclasses import dataclass, field\n@dataclass(order=True)\nclass Item:\n"
                    "    price: int\n    name: str = field(compare=False)\n"
                    "print(sorted([Item(3, 'c'), Item(1, 'a')])[0].name)", "a"),
    "enum": ("from enum import Enum, auto\nclass Color(Enum):\n    RED = auto()\n    BLUE = auto()\n"
             "Shape = Enum('Shape', 'SQUARE CIRCLE')\nprint(Color.BLUE.value, Shape.CIRCLE.name)", "2 CIRCLE"),
    "itertools": ("import itertools\nprint(sum(1 for c in itertools.combinations(range(6), 3)),"
                  " list(itertools.accumulate([1, 2, 3])))", "20 [1, 3, 6]"),
    "functools": ("from functools import lru_cache, reduce\n@lru_cache(None)\ndef fib(n):\n"
                  "    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
                  "print(fib(80), reduce(lambda a, b: a * b, range(1, 6)))", "23416728348467685 120"),
    "re": ("import re\nprint(re.findall(r'\\d+', 'a1b22c333'), re.sub(r'(\\w+)@', r'<\\1>', 'me@x'))",
           "['1', '22', '333'] <me>x"),
    "datetime": ("from datetime import date, timedelta\nprint((date(2024, 3, 1) - date(2024, 2, 1)).days,"
                 " date(2024, 1, 31) + timedelta(days=30))", "29 2024-03-01"),
    "json": ("import json\nprint(json.dumps({'b': [1, 2.5, None], 'a': True}, sort_keys=True))",
             '{"a": true, "b": [1, 2.5, null]}'),
    "heapq_bisect": ("import heapq, bisect\nh = [5, 1, 4]\nheapq.heapify(h)\nprint(heapq.heappop(h),"
                     " bisect.bisect_left([1, 3, 5, 7], 5), heapq.nlargest(2, [3, 9, 1, 7]))", "1 2 [9, 7]"),
    "typing": ("from typing import NamedTuple, TypeVar, Generic, Optional\nT = TypeVar('T')\n"
               "class Box(Generic[T]):\n    def __init__(self, v: T) -> None:\n        self.v = v\n"
               "class Pt(NamedTuple):\n    x: int\n    y: Optional[int] = None\n"
               "print(Box[int](3).v, Pt(1))", "3 Pt(x=1, y=None)"),
    "math_cmath": ("import math, cmath\nprint(math.comb(10, 3), math.isqrt(99), math.gcd(84, 36),"
                   " cmath.sqrt(-4))", "120 9 12 2j"),
    "collections": ("from collections import Counter, defaultdict, deque, OrderedDict\n"
                    "d = defaultdict(list); d['a'].append(1)\nq = deque([1, 2]); q.appendleft(0)\n"
                    "print(Counter('hello').most_common(1), dict(d), list(q), list(OrderedDict(b=1, a=2)))",
                    "[('l', 2)] {'a': [1]} [0, 1, 2] ['b', 'a']"),
    "string_textwrap": ("import string, textwrap\nprint(string.ascii_lowercase[:5], textwrap.shorten("
                        "'the quick brown fox', width=12))", "abcde the [...]"),
    "random_seeded": ("import random\nrandom.seed(7)\nprint(random.randint(1, 100))", None),
    "scratch_files": ("import csv, os, tempfile\nwith open('t.csv', 'w', newline='') as f:\n"
                      "    csv.writer(f).writerows([[1, 2], [3, 4]])\n"
                      "print(sum(int(x) for row in csv.reader(open('t.csv')) for x in row), os.listdir('.') != [])",
                      "10 True"),
    "copy_pprint_operator": ("import copy, pprint, operator\nx = {'a': [1, 2]}\ny = copy.deepcopy(x)\n"
                             "y['a'].append(3)\npprint.pprint(x)\nprint(sorted([(1, 'b'), (0, 'a')],"
                             " key=operator.itemgetter(1))[0])", "{'a': [1, 2]}\n(0, 'a')"),
    "asyncio": ("import asyncio\nasync def double(x):\n    await asyncio.sleep(0)\n    return 2 * x\n"
                "async def main():\n    return await asyncio.gather(*(double(i) for i in range(3)))\n"
                "print(asyncio.run(main()))", "[0, 2, 4]"),
    "thread_pools": ("from multiprocessing.pool import ThreadPool\nfrom concurrent.futures import "
                     "ThreadPoolExecutor\nwith ThreadPool(2) as p:\n    a = p.map(abs, [-1, -2])\n"
                     "with ThreadPoolExecutor(2) as ex:\n    b = list(ex.map(abs, [-3]))\nprint(a, b)",
                     "[1, 2] [3]"),
    "zoneinfo": ("import os\nfrom datetime import datetime\nfrom zoneinfo import ZoneInfo\n"
                 "if not os.path.exists('/usr/share/zoneinfo/UTC'):\n    print('UTC')\nelse:\n"
                 "    print(datetime(2024, 1, 1, tzinfo=ZoneInfo('UTC')).tzname())", "UTC"),
    "getpass_pwd": ("import getpass, pwd, os\nprint(getpass.getuser(), pwd.getpwuid(os.getuid()).pw_dir)",
                    "nobody /scratch"),
    "abc_contextlib": ("import abc, contextlib\nclass Base(abc.ABC):\n    @abc.abstractmethod\n"
                       "    def f(self): ...\nclass Impl(Base):\n    def f(self): return 4\n"
                       "with contextlib.suppress(ZeroDivisionError):\n    1 / 0\nprint(Impl().f())", "4"),
}


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_ordinary_model_code_runs_with_the_hook_on(name):
    code, expected = CORPUS[name]
    result = run_python(textwrap.dedent(code), SandboxLimits())
    assert result.error is None, result.text()
    if expected is not None:
        assert result.output.strip() == expected, result.output

"""Comments and docstrings say what the code does and why, in their own words: none of rollout/,
serve/, ops/ or tests/ cites a tracker's issue number in place of the goal or constraint it
stands for. The history of a choice belongs in git and in docs/benchmarks-history.md.

Comments are read with tokenize; docstrings are every string that stands alone as a statement
(a module's, a class's or a function's docstring, or a string under an assignment), read with
ast, so a string a program prints or sends is not judged here.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("rollout", "serve", "ops", "tests")
# the word, then a number: built from pieces so that this file holds no such citation itself
CITATION = re.compile(r"\b" + "iss" + r"ues?\s*#?\d+", re.IGNORECASE)


def comments_and_docstrings(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and every string that stands alone as a statement."""
    found = [(token.start[0], token.string)
             for token in tokenize.generate_tokens(io.StringIO(source).readline)
             if token.type == tokenize.COMMENT]
    found += [(node.lineno, node.value.value) for node in ast.walk(ast.parse(source))
              if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
              and isinstance(node.value.value, str)]
    return found


def citations(source: str) -> list[str]:
    """'line N: the citation' for each comment or docstring that cites an issue number."""
    return [f"line {line}: {match.group(0)!r}" for line, text in comments_and_docstrings(source)
            for match in CITATION.finditer(text)]


def test_the_finder_reads_comments_and_docstrings_but_not_other_strings():
    word = "Iss" + "ue"
    source = (f'"""A module. ({word} 12)"""\n\n'
              f"X = 1  # see {word.lower()}s #3 and 4\n"
              f'MESSAGE = "{word} 5 is printed, not judged"\n\n\n'
              f"def f():\n"
              f'    """Does a thing, as\n    {word.lower()}\n    26 asked."""\n')
    assert citations(source) == [f"line 3: '{word.lower()}s #3'", f"line 1: '{word} 12'",
                                 f"line 8: '{word.lower()}\\n    26'"]


def test_no_comment_or_docstring_cites_an_issue_number():
    found = [f"{path.relative_to(ROOT)} {where}"
             for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))
             for where in citations(path.read_text(encoding="utf-8"))]
    assert not found, ("state the goal or constraint the issue stood for (its history goes to "
                       "git or docs/benchmarks-history.md): " + "; ".join(found))

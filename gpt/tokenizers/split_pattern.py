"""The regular expression of a tokenizer.json's ``Split`` pre-tokenizer, checked before the ``tokenizers`` library
compiles it: the file is untrusted, and a pattern that backtracks catastrophically makes Oniguruma spend minutes on a
text, or give up on it (the library then panics: pyo3_runtime.PanicException, "retry-limit-in-match over").

Refused: a repeated part (``*``, ``+``, ``{n,m}``) that itself can match in more than one way (a quantifier or an
alternation inside it: ``(a+)+``, ``(a|ab)*``: exponential); two unbounded repeats, or bounded ones that can split a
run more than MAX_WAYS ways, followed by a part that can fail (``a*a*b``: polynomial at every position);
back-references and subexpression calls (not regular), conditionals and absent operators. The pre-tokenizer patterns
in use (GPT-2's, cl100k's, o200k's, Llama 3's, Qwen's, DeepSeek's) pass. What remains is at most linear at each
position (``a+(?!a)b``: quadratic over a run of a's): Oniguruma's retry limit stops it on a long run, and
gpt.tokenizers.tokenizer turns the library's panic into one error; the server refuses a prompt too long for the context
before encoding it.
"""

from __future__ import annotations

import re

MAX_PATTERN_CHARS = 16 * 1024  # the patterns in use are under 400 characters
MAX_DEPTH = 64  # groups inside groups (the patterns in use nest 1 deep)
MAX_SMALL_REPEAT = 32  # a repeat of at most this many (\p{N}{1,3}) costs a constant, not a run's length
MAX_WAYS = 1000  # the ways bounded repeats in a row can split a run (x{0,9}y{0,9}: 100) before a part that can fail
QUANTIFIER = re.compile(r"\*|\+|\?|\{(\d*)(,?)(\d*)\}")
NAMED = re.compile(r"\?(?:<|P<|')[A-Za-z_]\w*[>']")  # (?<name>, (?P<name>, (?'name'


class Refused(ValueError):
    """Why the pattern is refused."""


def problem(pattern: str) -> str | None:
    """What makes ``pattern`` unsafe to match, or None."""
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"it has {len(pattern):,} characters (at most {MAX_PATTERN_CHARS:,})"
    scanner = _Scanner(pattern)
    try:
        scanner.alternation()
        if scanner.i < len(pattern):
            raise Refused(f"it has an unmatched ')' at character {scanner.i}")
    except Refused as err:
        return str(err)
    return None


class _Scanner:
    """A walk over the pattern's groups, alternatives and quantifiers (Oniguruma's Ruby syntax). Each part reports
    whether it can match in more than one way (holds a quantifier of varying count, or an alternation), and how
    many unbounded repeats it ends with (``pending``): two of them followed by a part that can fail try every way
    of sharing a run between them at each position (a*a*b: polynomial), one is linear."""

    def __init__(self, pattern: str) -> None:
        self.p, self.i, self.depth = pattern, 0, 0

    def alternation(self) -> tuple[bool, int]:
        """Alternatives up to a ')' or the end: whether they vary, and the most pending repeats one ends with."""
        varies, pending = self.sequence()
        branches = 1
        while self.i < len(self.p) and self.p[self.i] == "|":
            self.i += 1
            more, left = self.sequence()
            varies, pending, branches = varies or more, max(pending, left), branches + 1
        return varies or branches > 1, pending

    def sequence(self) -> tuple[bool, int]:
        varies, pending, ways, first = False, 0, 1, 0
        while self.i < len(self.p) and self.p[self.i] not in "|)":
            start = self.i
            inner, inner_pending = self.atom()
            part_varies, least, most = self.quantified(inner, start)
            if least > 0 and (pending >= 2 or ways > MAX_WAYS):  # the part can fail after parts sharing a run
                raise Refused(f"it has repeats that can share a run ('{self.p[first:start][:60]}') followed by a "
                              f"part that can fail ('{self.p[start:self.i][:30]}'): backtracking takes polynomial "
                              "time on a long run of one character")
            grows = most is None or most > MAX_SMALL_REPEAT
            if (grows or inner_pending or most != least) and pending == 0 and ways == 1:
                first = start
            pending += grows + (inner_pending if most == 1 else 0)
            ways *= 1 if grows or most is None else most - least + 1
            varies = varies or part_varies
        return varies, pending

    def quantified(self, varies: bool, start: int) -> tuple[bool, int, int | None]:
        """The quantifier after an atom, if any (with its lazy ? or possessive + suffix): whether the part varies,
        and its least and most counts (None: unbounded)."""
        match = QUANTIFIER.match(self.p, self.i)
        if match is None or (match.group(0).startswith("{") and not (match.group(1) or match.group(3))):
            return varies, 1, 1  # no quantifier ("{" alone is a literal brace)
        self.i = match.end()
        if self.i < len(self.p) and self.p[self.i] in "?+":
            self.i += 1
        text = match.group(0)
        low, comma, high = match.groups() if text.startswith("{") else (None, None, None)
        least = {"*": 0, "+": 1, "?": 0}.get(text, int(low or 0))
        most = {"*": None, "+": None, "?": 1}.get(text, None if comma and not high else int(high or low or 0))
        if varies and (most is None or most > 1):
            part = self.p[start:match.start()]
            raise Refused(f"it repeats '{part[:60]}', which itself can match in more than one way (a quantifier or "
                          "an alternation inside a repeated part backtracks exponentially)")
        return varies or most != least, least, most

    def atom(self) -> tuple[bool, int]:
        ch = self.p[self.i]
        if ch == "(":
            return self.group()
        if ch == "\\":
            self.escape()
        elif ch == "[":
            self.char_class()
        else:
            self.i += 1
        return False, 0

    def escape(self) -> None:
        nxt = self.p[self.i + 1 : self.i + 2]
        if not nxt:
            raise Refused("it ends with a lone backslash")
        if nxt in "123456789" or nxt in "kg":
            raise Refused(f"it has a back-reference or subexpression call ('\\{nxt}'), which is not a regular "
                          "expression and can backtrack without bound")
        self.i += 2
        if nxt in "pPx" and self.p[self.i : self.i + 1] == "{":  # \p{L}, \x{263a}
            end = self.p.find("}", self.i)
            if end < 0:
                raise Refused(f"it has an unterminated '\\{nxt}{{'")
            self.i = end + 1

    def char_class(self) -> None:
        """Skip a bracket expression (nested ones too, as Oniguruma allows: [a-z&&[^aeiou]])."""
        depth = 0
        while self.i < len(self.p):
            ch = self.p[self.i]
            self.i += 2 if ch == "\\" else 1
            if ch == "[":
                depth += 1
                self.i += self.p.startswith("^", self.i)
                self.i += self.p.startswith("]", self.i)  # a ] first is a literal
            elif ch == "]":
                depth -= 1
                if depth == 0:
                    return
        raise Refused("it has an unterminated '['")

    def group(self) -> tuple[bool, int]:
        self.i += 1
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise Refused(f"it nests groups more than {MAX_DEPTH} deep")
        if self.p.startswith("?#", self.i):  # a comment
            end = self.p.find(")", self.i)
            if end < 0:
                raise Refused("it has an unterminated '(?#'")
            self.i = end + 1
            self.depth -= 1
            return False, 0
        if self.p.startswith(("?(", "?~"), self.i):
            raise Refused("it has a conditional or absent-operator group, which this project does not take")
        flags = re.compile(r"\?[imxWDSPayu-]*\)").match(self.p, self.i)
        if flags:  # (?i): flags for the rest, no group
            self.i = flags.end()
            self.depth -= 1
            return False, 0
        named = NAMED.match(self.p, self.i)
        if named:
            self.i = named.end()
        else:
            prefix = re.compile(r"\?(?:[imx-]*:|[=!>]|<[=!])").match(self.p, self.i)
            if prefix:
                self.i = prefix.end()
            elif self.p.startswith("?", self.i):
                raise Refused(f"it has a group '({self.p[self.i:self.i + 4]}' this project does not know")
        inside = self.alternation()
        if self.p[self.i : self.i + 1] != ")":
            raise Refused("it has an unterminated '('")
        self.i += 1
        self.depth -= 1
        return inside

"""The compute rails as a list of HCA names, and the same list as a regular expression.

The config holds one list, `ib.rails` (rail i is HCA i of every node). Sites that wrote the older
`hardware.ib_devices`, a regular expression such as `mlx5_[0-7]`, still load: `names_of` spells such a
pattern out as the names it matches. It takes literals, classes ([0-7], \\d), groups with | and the
bounded repeats ?, {n} and {m,n}; a pattern that matches without bound (., *, +) names no list.
`regex_of` is the other way, for PromQL's `device=~"..."` and sysfs: mlx5_0..mlx5_7 -> mlx5_[0-7].
"""

import re

MAX_NAMES = 256
HCA_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_DIGITS = "0123456789"


def names_of(pattern: str) -> list[str]:
    """Every name that `pattern` (fully anchored) matches, in the pattern's order; ValueError saying
    why when it matches without bound or more than MAX_NAMES names."""
    parser = _Parser(pattern)
    names = parser.alternation()
    if parser.pos != len(pattern):
        raise ValueError(f"an unbalanced ')' at {parser.pos}")
    return list(dict.fromkeys(names))


def regex_of(names: tuple[str, ...]) -> str:
    """A regular expression (RE2 and Python alike, written without backslashes so that it goes into
    a PromQL string as it is) that fully matches exactly `names`: names that differ only in their last
    digit share one class."""
    ends: dict[str, list[str]] = {}
    for name in names:
        stem, last = (name[:-1], name[-1]) if len(name) > 1 and name[-1] in _DIGITS else (name, "")
        ends.setdefault(stem, []).append(last)
    parts = []
    for stem, lasts in ends.items():
        literal = stem.replace(".", "[.]")
        if "" in lasts:
            parts.append(literal)
        digits = sorted({d for d in lasts if d})
        if len(digits) == 1:
            parts.append(literal + digits[0])
        elif digits:
            contiguous = "".join(digits) == _DIGITS[_DIGITS.index(digits[0]):_DIGITS.index(digits[-1]) + 1]
            parts.append(f"{literal}[{digits[0]}-{digits[-1]}]" if contiguous else f"{literal}[{''.join(digits)}]")
    return "|".join(parts)


class _Parser:
    """A recursive descent over the finite part of the regular expression syntax."""

    def __init__(self, text: str):
        self.text, self.pos = text, 0

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def take(self) -> str:
        char = self.peek()
        self.pos += 1
        return char

    def alternation(self) -> list[str]:
        names = self.sequence()
        while self.peek() == "|":
            self.pos += 1
            names += self.sequence()
        return names

    def sequence(self) -> list[str]:
        names = [""]
        while self.peek() not in ("", "|", ")"):
            atom = self.repeat(self.atom())
            names = [a + b for a in names for b in atom]
            if len(names) > MAX_NAMES:
                raise ValueError(f"more than {MAX_NAMES} names")
        return names

    def atom(self) -> list[str]:
        char = self.take()
        if char == "(":
            if self.text.startswith("?:", self.pos):
                self.pos += 2
            elif self.peek() == "?":
                raise ValueError("a (? group other than (?:")
            names = self.alternation()
            if self.take() != ")":
                raise ValueError("an unclosed group")
            return names
        if char == "[":
            return self.char_class()
        if char == "\\":
            return self.escape()
        if char in ".*+^$?{":
            raise ValueError(f"{char!r} matches without bound" if char in ".*+" else f"{char!r} here")
        return [char]

    def repeat(self, names: list[str]) -> list[str]:
        char = self.peek()
        if char in ("*", "+"):
            raise ValueError(f"{char!r} repeats without bound")
        if char == "?":
            self.pos += 1
            return ["", *names]
        if char != "{":
            return names
        end = self.text.find("}", self.pos)
        bounds = re.fullmatch(r"(\d+)(?:,(\d+))?", self.text[self.pos + 1:end]) if end > 0 else None
        if bounds is None:
            raise ValueError("a repeat {m,} without bound")
        self.pos = end + 1
        low, high = int(bounds.group(1)), int(bounds.group(2) or bounds.group(1))
        out: list[str] = []
        for count in range(low, high + 1):
            words = [""]
            for _ in range(count):
                words = [a + b for a in words for b in names]
                if len(words) > MAX_NAMES:
                    raise ValueError(f"more than {MAX_NAMES} names")
            out += words
        return out

    def char_class(self) -> list[str]:
        if self.peek() == "^":
            raise ValueError("a negated class [^...] matches without bound")
        chars: list[str] = []
        while self.peek() not in ("]", ""):
            first = self.escape() if self.take() == "\\" else [self.text[self.pos - 1]]
            if self.peek() == "-" and self.text[self.pos + 1:self.pos + 2] not in ("]", "") and len(first) == 1:
                self.pos += 1
                last = self.escape()[0] if self.take() == "\\" else self.text[self.pos - 1]
                chars += [chr(c) for c in range(ord(first[0]), ord(last) + 1)]
            else:
                chars += first
        if self.take() != "]":
            raise ValueError("an unclosed class")
        return list(dict.fromkeys(chars))

    def escape(self) -> list[str]:
        char = self.take()
        if char == "d":
            return list(_DIGITS)
        if char and not char.isalnum():
            return [char]
        raise ValueError(f"the escape \\{char}")

"""The tokens of a MySQL statement: a tokenizer that respects quotes and comments (joining the
texts of the tokens gives the statement back unchanged), and a reader over its significant tokens."""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs

_TOKEN = re.compile(
    r"""(?P<ws>(?:\s+|/\*(?!!).*?\*/|\#[^\n]*|--(?:\s[^\n]*)?(?=\n|$))+)
      | (?P<ident>`(?:[^`]|``)*`)
      | (?P<string>'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.|"")*")
      | (?P<xcomment>/\*!.*?\*/)
      | (?P<word>[\w$]+)
      | (?P<punct>.)""",
    re.S | re.X,
)


@attrs.frozen
class Token:
    """One lexical token of a DDL statement as `tokenize` splits it; joining the texts of every
    token gives the statement back unchanged, so a rename edits only the tokens it means."""

    kind: str  # ws, ident (backquoted), string, xcomment, word, punct
    text: str

    @property
    def upper(self) -> str:
        return self.text.upper() if self.kind == "word" else ""

    @property
    def is_name(self) -> bool:
        """A token that can name a table or column: backquoted, or a word not starting with a digit."""
        return self.kind == "ident" or (self.kind == "word" and not self.text[0].isdigit())

    @property
    def name(self) -> str:
        return self.text[1:-1].replace("``", "`") if self.kind == "ident" else self.text


def tokenize(statement: str) -> list[Token]:
    """Every character of `statement` in exactly one token (joining the texts gives it back)."""
    tokens = []
    for match in _TOKEN.finditer(statement):
        kind = match.lastgroup
        assert kind is not None
        tokens.append(Token(kind, match.group()))
    return tokens


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class Reader:
    """Walks the significant tokens (not whitespace or plain comments) of a token list."""

    def __init__(self, tokens: Sequence[Token]) -> None:
        self.tokens = tokens
        self.sig = [i for i, t in enumerate(tokens) if t.kind != "ws"]
        self.at = 0

    def peek(self, ahead: int = 0) -> Token | None:
        k = self.at + ahead
        return self.tokens[self.sig[k]] if k < len(self.sig) else None

    def next(self) -> Token:
        token = self.peek()
        if token is None:
            raise ValueError("the statement ends too early")
        self.at += 1
        return token

    def done(self) -> bool:
        return self.at >= len(self.sig)

    def sees(self, text: str, ahead: int = 0) -> bool:
        """Whether the token `ahead` is `text` (a word compared without case)."""
        token = self.peek(ahead)
        return token is not None and (token.text == text or token.upper == text)

    def rest(self) -> list[Token]:
        """The significant tokens not read yet."""
        return [self.tokens[i] for i in self.sig[self.at:]]

    def word(self, *words: str) -> bool:
        """Consume the next token if it is one of `words`."""
        token = self.peek()
        if token is not None and token.upper in words:
            self.at += 1
            return True
        return False

    def words(self, *sequence: str) -> bool:
        """Consume `sequence` if the next tokens are exactly it."""
        for k, word in enumerate(sequence):
            token = self.peek(k)
            if token is None or token.upper != word:
                return False
        self.at += len(sequence)
        return True

    def group(self) -> list[Token]:
        """Consume a parenthesised group; its significant tokens without the outer parentheses."""
        if self.next().text != "(":
            raise ValueError("expected '('")
        depth = 1
        inner: list[Token] = []
        while True:
            token = self.next()
            depth += {"(": 1, ")": -1}.get(token.text, 0)
            if depth == 0:
                return inner
            inner.append(token)


__all__ = ["Reader", "Token", "quote", "tokenize"]

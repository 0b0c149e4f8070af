"""A table's schema-change policy (``schema_changes``) decided on a routed DDL model, once, where
Extract routes it, so that every target applies, keeps or refuses the same statement
(docs/schema-changes.md says what the target holds afterwards under each policy)."""

from __future__ import annotations

import attrs

from setl.ddl.model import Element, Statement
from setl.ddl.rewrite import rewrite

#: The policies, in the order of what they let through (most first).
POLICIES = ("apply", "ignore_drops", "additive_only", "refuse")

#: Statement kinds that change no table's schema: a TRUNCATE is data (every policy applies it, so
#: the target keeps the source's rows), and "other" is no table DDL (the targets skip it).
_NOT_SCHEMA = frozenset({"truncate_table", "other"})

#: Words after DROP that drop something other than a column.
_DROP_NOT_COLUMN = frozenset({"INDEX", "KEY", "PRIMARY", "FOREIGN", "CONSTRAINT", "CHECK", "PARTITION",
                              "FULLTEXT", "SPATIAL", "UNIQUE", "PERIOD", "SYSTEM"})
#: Words after ADD that add a plain (non-unique) index.
_ADD_INDEX = frozenset({"INDEX", "KEY", "FULLTEXT", "SPATIAL"})
#: ALTER TABLE clauses that say how the server runs the statement, not what it changes.
_NEUTRAL = frozenset({"ALGORITHM", "LOCK"})


@attrs.frozen
class Decision:
    """What a policy makes of one routed statement: the statement to apply (None: nothing left),
    or why it is refused (`refused`, one clause naming the policy); `kept` names the columns whose
    DROP ``ignore_drops`` left out (they stay on the target)."""

    statement: Statement | None
    refused: str | None = None
    kept: tuple[str, ...] = ()


def decide(policy: str, statement: Statement) -> Decision:
    """`statement` (routed: names mapped) under `policy` (one of `POLICIES`):

    * ``apply``: applied as it is;
    * ``ignore_drops``: an ALTER TABLE's DROP [COLUMN] clauses are cut (None when nothing is left);
      one that drops a column and names it again (re-adds it) is refused; anything else applies;
    * ``additive_only``: applied when `not_additive` finds nothing against it, refused otherwise;
    * ``refuse``: every schema change is refused.

    A TRUNCATE (data, not schema) and a statement that is no table DDL pass under every policy.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown schema_changes policy {policy!r} (one of {', '.join(POLICIES)})")
    if policy == "apply" or statement.kind in _NOT_SCHEMA:
        return Decision(statement)
    if policy == "refuse":
        return Decision(statement, refused="schema_changes is refuse: it refuses every schema change")
    if policy == "additive_only":
        why = not_additive(statement)
        if why is None:
            return Decision(statement)
        return Decision(statement, refused=f"schema_changes is additive_only: {why}")
    return _ignore_drops(statement)


def not_additive(statement: Statement) -> str | None:
    """None when `statement` only adds (what ``additive_only`` applies), otherwise why not.

    Additive: CREATE TABLE or SEQUENCE (not OR REPLACE); CREATE INDEX (not UNIQUE); an ALTER TABLE
    whose every clause is ADD [COLUMN] of columns that are nullable or have a DEFAULT and are no
    key and not AUTO_INCREMENT, ADD INDEX|KEY|FULLTEXT|SPATIAL, or ALGORITHM=/LOCK=. Anything
    else changes or constrains what the target holds: a DROP, MODIFY, CHANGE, ALTER COLUMN,
    RENAME, ADD UNIQUE|PRIMARY KEY|FOREIGN KEY|CONSTRAINT|CHECK|PARTITION, a table option,
    DROP TABLE, RENAME TABLE, DROP INDEX, ALTER or DROP SEQUENCE.
    """
    kind = statement.kind
    if kind in ("create_table", "create_sequence"):
        return "CREATE OR REPLACE drops the table" if "REPLACE" in statement.head else None
    if kind == "create_index":
        return "a UNIQUE index constrains the rows" if "UNIQUE" in statement.head else None
    if kind != "alter_table":
        return f"{kind.replace('_', ' ').upper()} is not an addition"
    for element in statement.elements:
        why = _clause_not_additive(element)
        if why is not None:
            return why
    return None


def _clause_not_additive(element: Element) -> str | None:
    clause = " ".join(t.text for t in element.tokens[:4])
    if element.word in _NEUTRAL:
        return None
    if element.word != "ADD":
        return f"{element.word or 'the clause'} is not an addition ({clause} ...)"
    if element.columns:
        for column in element.columns:
            if column.key or column.auto_increment:
                return f"ADD COLUMN {column.name} makes a key"
            if column.not_null and column.default is None and not column.generated:
                return (f"ADD COLUMN {column.name} is NOT NULL without a DEFAULT (what existing rows get "
                        "differs between targets)")
        return None
    second = element.tokens[1].upper if len(element.tokens) > 1 else ""
    if second in _ADD_INDEX:
        return None
    return f"ADD {second} is not a plain column or index ({clause} ...)"


def dropped_columns(statement: Statement) -> tuple[str, ...]:
    """The columns an ALTER TABLE's DROP [COLUMN] [IF EXISTS] clauses drop, in order."""
    if statement.kind != "alter_table":
        return ()
    names = []
    for element in statement.elements:
        if element.word != "DROP" or len(element.tokens) < 2:
            continue
        words = list(element.tokens[1:])
        if words[0].upper in _DROP_NOT_COLUMN:
            continue
        if words[0].upper == "COLUMN":
            words = words[1:]
        if len(words) >= 2 and words[0].upper == "IF" and words[1].upper == "EXISTS":
            words = words[2:]
        if words:
            names.append(words[0].name)
    return tuple(names)


def _ignore_drops(statement: Statement) -> Decision:
    dropped = dropped_columns(statement)
    if not dropped:
        return Decision(statement)
    lowered = {name.lower() for name in dropped}
    named = [statement.tokens[i].name.lower() for i in statement.columns]
    again = sorted({name for name in named if name in lowered and named.count(name) > 1})
    if again:
        return Decision(statement, refused=(
            f"schema_changes is ignore_drops: the statement drops and names again column(s) "
            f"{', '.join(again)} (a re-added column cannot be kept)"), kept=dropped)
    schema = statement.tables[0].schema or ""
    left = rewrite(statement, schema, lambda s, t: (s, t), None, lambda name: name.lower() not in lowered)
    return Decision(left, kept=dropped)


__all__ = ["POLICIES", "Decision", "decide", "dropped_columns", "not_additive"]

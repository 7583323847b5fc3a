"""The lane tables name tests and fixtures that exist: a renamed test would otherwise silently
move to the other lane."""

import ast
from pathlib import Path

import pytest

from tests.support.lanes import SLOW, STARTS_PROCESSES

TESTS = Path(__file__).resolve().parents[1]


def defined(module: str) -> set[str]:
    tree = ast.parse((TESTS / module).read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


@pytest.mark.parametrize("table", [STARTS_PROCESSES, SLOW], ids=["processes", "slow"])
def test_every_entry_names_a_test_or_fixture_of_its_module(table):
    for module, entries in table.items():
        assert (TESTS / module).is_file(), module
        names = defined(module)
        for entry in entries:
            name = entry.partition("[")[0]
            assert name == "*" or name in names, f"{module} has no {name}"


def test_a_test_is_in_one_table_at_most():
    for module in STARTS_PROCESSES.keys() & SLOW.keys():
        assert not set(STARTS_PROCESSES[module]) & set(SLOW[module]), module

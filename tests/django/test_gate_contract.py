"""The gate contract suites (tests/gates/test_gate_contract.py and test_grantor_contract.py), run against
DjangoGate on PostgreSQL and SQLite.

The tests are the same functions; only the ``adapter`` fixture (conftest.py
here) differs. The cross-process test needs Django set up in each child, so it
has a Django version below.
"""

from __future__ import annotations

from tests.gates.test_gate_contract import (
    _check_history,
    appends_in_processes,
    test_bad_input_is_refused_and_changes_nothing,
    test_claim_race_loses_no_deposit,
    test_concurrent_threads_keep_the_mark_monotonic,
    test_current_token_is_used_when_none_is_given,
    test_equal_token_is_accepted,
    test_failed_write_changes_neither_data_nor_mark,
    test_higher_token_advances_the_mark,
    test_lower_token_is_rejected_with_its_fields,
    test_paused_writer_is_fenced_out,
    test_rejected_write_changes_neither_data_nor_mark,
    test_resources_are_independent,
    test_token_of_another_resource_cannot_write_bound_data,
)
from tests.gates.test_grantor_contract import (
    test_mark_without_grantor_adopts_the_first_grantor,
    test_reset_mark_is_a_compare_and_set,
    test_reset_mark_moves_a_resource_to_a_new_grantor,
    test_token_of_another_grantor_is_refused_and_changes_nothing,
    test_wiped_grantor_token_reports_the_mismatch_not_staleness,
)

from .adapters import DjangoAdapter, child_append

__all__ = [
    "test_bad_input_is_refused_and_changes_nothing",
    "test_claim_race_loses_no_deposit",
    "test_concurrent_processes_keep_the_mark_monotonic",
    "test_concurrent_threads_keep_the_mark_monotonic",
    "test_current_token_is_used_when_none_is_given",
    "test_equal_token_is_accepted",
    "test_failed_write_changes_neither_data_nor_mark",
    "test_higher_token_advances_the_mark",
    "test_lower_token_is_rejected_with_its_fields",
    "test_mark_without_grantor_adopts_the_first_grantor",
    "test_paused_writer_is_fenced_out",
    "test_rejected_write_changes_neither_data_nor_mark",
    "test_reset_mark_is_a_compare_and_set",
    "test_reset_mark_moves_a_resource_to_a_new_grantor",
    "test_resources_are_independent",
    "test_token_of_another_grantor_is_refused_and_changes_nothing",
    "test_token_of_another_resource_cannot_write_bound_data",
    "test_wiped_grantor_token_reports_the_mismatch_not_staleness",
]


def test_concurrent_processes_keep_the_mark_monotonic(adapter: DjangoAdapter) -> None:
    """Processes with their own Django connections appending random tokens keep the same history rules."""
    _check_history(adapter, "hot", "log", appends_in_processes(child_append, adapter.alias))

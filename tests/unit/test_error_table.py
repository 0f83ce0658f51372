"""One table of rollout errors for both edges (rollout.errors.ANSWERS): the `rollout` command's
exit codes (ops.cli.errors) and the dashboard's HTTP statuses (serve.dashboard.errors)."""

from __future__ import annotations

import inspect

import pytest

import rollout.errors as errors
from ops.cli.errors import EXITS, exit_for
from rollout.errors import ANSWERS, RampNotAllowed, RevisionConflict, answer_for
from serve.dashboard.errors import RampNotPossible, dashboard_error

KINDS = [k for _, k in inspect.getmembers(errors, inspect.isclass)
         if issubclass(k, errors.RolloutError)]


def _raise(kind):
    return kind(1, 2) if kind is RevisionConflict else kind("why")


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_every_rollout_error_has_one_exit_code_and_status_on_both_edges(kind):
    answer = answer_for(kind)
    assert answer is not None
    code, message, _ = exit_for(_raise(kind))
    assert code == answer.exit_code and message.startswith("error: ")
    error = dashboard_error(_raise(kind), "said")
    if answer.http_status is None:
        assert error is None
    else:
        assert error.status == answer.http_status and str(error) == "said"


def test_the_tables_put_the_specific_types_first():
    types = [kind for kind, _ in ANSWERS]
    assert types[-1] is errors.RolloutError
    exits = [row.kind for row in EXITS]
    assert exits[-1] is Exception
    for table in (types, exits):
        for i, kind in enumerate(table):
            assert not any(issubclass(later, kind) and later is not kind
                           for later in table[i + 1:]), kind


def test_a_ramp_that_does_not_allow_an_action_is_a_409_of_its_own_type():
    assert isinstance(dashboard_error(RampNotAllowed("no ramp"), "no ramp"), RampNotPossible)


def test_errors_outside_the_table_are_not_swallowed():
    with pytest.raises(SystemExit):
        exit_for(SystemExit(3))
    assert exit_for(KeyError("k"))[:2] == (1, "error: unexpected KeyError: 'k'")

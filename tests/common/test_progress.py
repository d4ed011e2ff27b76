"""The time-left estimate (common/progress.py) counts the evaluations still to come (issue 75 item 10)."""

from common.progress import eta_line


def test_the_estimate_adds_the_evaluations_the_first_round_did_not_have():
    # 12 rounds of a run evaluated every 12: round 1 took 60 s without an evaluation, 11 rounds are
    # left, one of them (the last) evaluated, and round 0's evaluation took 300 s
    line = eta_line(1, 60.0, 11, evaluations=1, evaluation_s=300.0)
    assert line == "about 16.0 min for the 11 rounds left (60.0 s a round so far, and 1 evaluation of 300 s)"
    assert eta_line(1, 60.0, 11) == "about 11.0 min for the 11 rounds left (60.0 s a round so far)"

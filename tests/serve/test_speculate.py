"""Prompt lookup's guesses (gpt.serve.speculate.lookup): what a sequence that repeats itself is guessed to do next."""

from __future__ import annotations

from gpt.serve.speculate import lookup


def test_a_run_of_one_token_is_guessed_a_whole_draft_at_a_time():
    """The latest occurrence of the last n-gram is one token back, with one token after it: the guesses go on with
    the same period, a draft's worth (one guess a step made speculation no faster than decoding alone)."""
    assert lookup([7, 5, 5, 5, 5], draft=4) == [5, 5, 5, 5]
    assert lookup([9, 1, 2, 1, 2, 1, 2], draft=5) == [1, 2, 1, 2, 1]
    assert lookup([1, 2, 3, 9, 1, 2, 3], draft=6) == [9, 1, 2, 3, 9, 1]


def test_the_latest_occurrence_of_the_longest_ngram_leads():
    """The tokens after the latest earlier occurrence of the last 3 tokens; 2 or 1 tokens where 3 never repeat;
    nothing where no token repeats."""
    assert lookup([1, 2, 3, 9, 8, 1, 2, 3, 7, 6, 5, 1, 2, 3], draft=3) == [7, 6, 5]
    assert lookup([4, 2, 3, 8, 8, 1, 2, 3], draft=2) == [8, 8]  # "2 3" repeats, "1 2 3" does not
    assert lookup([3, 6, 1, 5], draft=2) == []
    assert lookup([5], draft=2) == []

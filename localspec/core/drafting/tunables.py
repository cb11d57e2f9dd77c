"""The copying drafters' tunables, in one table: each name with the rule it sets.

Prompt lookup (``ngram``), a prediction (``prediction``) and the datastores (``store``) are
one drafter, ``copying.CopyDrafter``, over three copy sources; what their evidence is worth
and how far they read is set here and nowhere else. Why the numbers are what they are is in
docs/how-it-works.md ("What makes a draft pay", "Predictions", "Datastores"), what they give
in docs/measurements.md; ``core.replay`` shows what a change to one does over recorded
answers before it is benchmarked.
"""

from __future__ import annotations

from typing import NamedTuple

from localspec.core.controller import REACH_ALPHA, REACH_CHANCE, SPECULATE_MARGIN


class Prior(NamedTuple):
    """What a draft on some evidence is worth before its text has shown whether it copies."""

    copy_chance: float  # chance it starts a long copy, in a text that copies
    parting: float  # acceptance per token of a draft that parts instead


# -- what evidence is worth --------------------------------------------------------------------

# A suffix match, by the smallest length of its bucket: the longer the match, the likelier a
# long copy and the more a parting copy keeps. The chances are those of matches in code, where
# copies are common; prose copies far less, which the text's odds (below) learn. The parting
# rates sit under the ones measured, since first drafts in prose cost more than they returned
# at the measured ones.
MATCH_PRIORS = (
    (1, Prior(0.1, 0.0)),
    (2, Prior(0.16, 0.1)),
    (3, Prior(0.27, 0.25)),
    (4, Prior(0.41, 0.48)),
    (6, Prior(0.5, 0.62)),
    (8, Prior(0.59, 0.7)),
    (12, Prior(0.73, 0.78)),
    (16, Prior(0.92, 0.92)),
)
# A parted copy the answer came back to (a renamed variable, an inserted hint): less sure than
# a 3-token match of going on at length, since the answer has just shown that it edits.
RESUMED_PRIOR = Prior(0.3, 0.25)
# A prediction's first tokens once the answer has come to them, or a long copy of it the
# answer came back to after an edit: the caller said the answer copies it, so it is worth a
# 12-token match.
START_PRIOR = Prior(0.73, 0.78)
# Acceptance per token along a long copy (code copied from its source), and the most any
# chance of a long copy is taken to be (a copy can always end): the controller's reach in a
# deficit is measured on these.
COPY_ALPHA = REACH_ALPHA
COPY_MAX = REACH_CHANCE

# -- what a text's grades teach ----------------------------------------------------------------

# A text's odds of long copies against the priors' chances start at COPY_ODDS, worth
# COPY_PSEUDO graded drafts: unknown text pays for at most a draft or two before its grades
# show that it does not copy.
COPY_ODDS = 0.5
COPY_PSEUDO = 1.0
COPY_DEPTH = 12  # a draft (or a draft passed over) is graded a copy when it held this long
COPY_DECAY = 0.9  # per graded draft: a text that copied may go on to write anew
# Drafted tokens accepted in a row from one copy (one draft, or short drafts accepted whole)
# that make it a copy under way, priced by its own estimate from then on: a copy drafted in
# cheap short batches earns the estimates that may lengthen them.
STREAK_MIN = 8
STREAK_PRIOR = 0.97  # acceptance per token of a copy under way before its estimate has any

# -- prompt lookup: reading a copy in the prompt and the answer --------------------------------

LONG_KEY = 4  # occurrences of the suffix are found by keys this long (and n_min), then measured
MAX_CANDIDATES = 256  # the most recent occurrences of a key measured per round
# A copy under way keeps its own place over a suffix match shorter than this: the suffix of
# a text that edits its source matches little even where the copy goes on.
RESYNC_BELOW = 6
RESYNC_MISSES = 8  # answer tokens a parted copy waits for before its place is lost
EDIT_MAX = 8  # the most tokens an edit's source span, and what replaces it, may have
EDIT_REACH = 8  # source tokens past the parting point where a replaced span may end
MAX_EDITS = 64  # edits kept per text (the oldest go first)
# What the answer wrote between parting and coming back, through the tokens that agree
# again, is no edit when it occurs together earlier in the text, at least this long: the
# answer copied another passage (a line as another docstring of the file has it); a shorter
# span is found by chance too often to say so.
COPIED_SPAN = 3
# A fixed policy (``--drafter ngram``) has no cost model to weigh a short match: it drafts
# from matches at least this long (and copies it follows), as llama.cpp's n-gram modes look
# up long keys.
FIXED_MIN_MATCH = 8

# -- a prediction --------------------------------------------------------------------------

PREDICTION_COPY_ODDS = 1.0  # twice prompt lookup's: the caller vouches for the text
# A prediction's draft before the answer has written anything may fail at its first token
# (the answer opens with a code fence or a sentence): it is kept as long as failing it costs
# at most this many plain steps, the margin a draft must win by anyway, so that where a
# batch costs little more than a step it is short.
BLIND_COST = SPECULATE_MARGIN
# A copy of the prediction that parted after following it this far was the answer copying
# it: an edit interrupted it, and where the answer comes back it is priced as at the start.
RESUME_AFTER = 16

# -- the datastores ------------------------------------------------------------------------

EXAMINED = 32  # occurrences of a match whose continuations are read (spread over all)
# A store is the user's own corpus, which may have nothing to do with the text at hand: its
# odds of long copies start at half prompt lookup's and are earned the same way.
STORE_COPY_ODDS = 0.25
# A long store match says less than a long match in the prompt (a question quoting a file
# matches it for as long as it quotes it, and the answer then writes its own code): until
# the text shows that it copies the store, a store draft is priced as parting almost at once.
STORE_PARTING = 0.25

"""Drafting: who proposes the tokens the target verifies, each drafter pricing its own offers.

- ``base``: the ``Drafter`` protocol (begin, offer, propose, observe, learned and restore;
  ``Branching`` for draft trees), ``Offer``, ``Draft``, ``Outcome``, ``Resources``.
- ``copying``: what the drafters that copy earlier text share (the vote, streaks, copy
  pricing and its learning, the grading of drafts rounds passed over).
- ``follow``: the reading of a copy through the edits an answer makes, which prompt lookup
  and a prediction share.
- ``ngram`` (prompt lookup), ``prediction`` (a predicted answer), ``store`` (the user's
  datastores), ``model`` (the draft model): one module per drafter, each with a
  ``build(params, resources)``.
- ``registry``: which modes draft with which drafters; adding a drafter is a module and a
  line there.
"""

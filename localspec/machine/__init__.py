"""This machine's facts: where each model's layers run (``placement``), the step costs
measured here and their cache (``calibrate``, ``costcache``), and the target its GPU's free
memory suggests (``suggest``). Builds on backend, models and storage; loads no pair of its
own (the costs are measured on a pair the session loads)."""

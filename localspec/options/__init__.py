"""The front ends' contract: the options people give, declared once as groups every front
end takes (``model``: the machinery and the pair's groups; ``stores``; ``generation``;
``bench``: the bench's own), and how each value is checked and worded for the front end
that took it. Builds on the session's ``ModelOptions`` and ``GenerationParams``; the
command line, the Python API, the bench and the server all read their options here.
"""

"""The OpenAI-compatible HTTP server: ``worker`` owns the session, ``app`` speaks HTTP."""

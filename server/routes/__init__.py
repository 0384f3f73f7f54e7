"""The v1 blueprints. Each view parses its request, calls one service function and serialises the
answer; the helpers in `common` do the parsing and authentication the same way everywhere."""

"""Measured speed: tuning tables (``table``), where they are found (``sources``), what they say about
a layer (``model``), and how they are made (``tune``, which needs a GPU and is imported only by the
``tune`` command). The call path imports ``table``, ``sources`` and ``model`` only."""

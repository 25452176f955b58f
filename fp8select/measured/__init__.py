"""Measured speed, as data the plans read: tuning tables (``table``), where a device's are found
(``sources``) and what they say about a layer (``model``). Pure: nothing here times anything
(that is :mod:`fp8select.measure`)."""

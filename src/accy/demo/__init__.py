"""The demo: a named-axis transformer trained to sort digits (`accy demo`)."""

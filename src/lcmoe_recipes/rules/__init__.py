"""Rules: pure functions, one decision each, each returning (value, Reason) with the source of the rule."""

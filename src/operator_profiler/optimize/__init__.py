"""Profile-guided optimization: the change vocabulary (:mod:`.changes`), FX passes (:mod:`.passes`), numerics (:mod:`.numerics`)."""

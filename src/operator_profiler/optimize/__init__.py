"""Profile-guided optimization: the changes, their numerics and speed verification, and the ablation."""

"""Profile-guided optimization: the advisor (rule catalog over a profile), the changes it advises (settings, compiler options, FX passes), their numerics and verification."""

"""Profile-guided optimization: the advisor (rule catalog over a profile), the changes it advises, their verification."""

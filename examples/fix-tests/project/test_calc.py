import sys

from calc import add

failures = [f"add({a}, {b}) should be {want}, got {add(a, b)}"
            for a, b, want in [(1, 2, 3), (2, 2, 4)] if add(a, b) != want]
print("\n".join(failures) or "all tests pass")
sys.exit(1 if failures else 0)

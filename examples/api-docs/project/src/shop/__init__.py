"""A small shop API: the public functions documented in docs/api.md."""


def price(item: str, quantity: int = 1) -> float:
    """The price of ``quantity`` items."""
    return {"apple": 0.5, "pear": 0.75}.get(item, 1.0) * quantity


def order(items: dict[str, int]) -> float:
    """The total of an order: item name to quantity."""
    return sum(price(name, n) for name, n in items.items())

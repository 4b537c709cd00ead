"""The recipe tests' shared fixture: the committed recipe sets, read once."""

from fixtures.recipes_static import static_recipes

__all__ = ["static_recipes"]

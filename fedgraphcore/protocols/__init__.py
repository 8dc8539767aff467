"""Protocol math of each method as plain functions over arrays (no Flower)."""

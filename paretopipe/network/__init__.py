"""Networks: named network conditions (profiles.toml), the emulated link, tc trees, the link probe."""

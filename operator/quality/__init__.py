"""Quality watch decisions: is a reduced-precision engine still agreeing with its
full-precision reference on live traffic, overall, per class and per slice? Pure."""

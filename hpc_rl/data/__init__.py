"""Experience as it travels: the batch schema, segments of steps, and their wire format."""

"""The dashboard's widgets, one per module: the header, the PAUSED banner, and the five panes."""

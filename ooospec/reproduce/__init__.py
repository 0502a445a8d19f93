"""How the whole artifact is rerun: `time_plan` (`make reproduce` within a time budget, from the
machine calibration and the committed audit) and `ray_sweep` (`make sweep`: the bench's cells as
Ray tasks). The top layer: it may import the studies, the report, the harness and everything below.
"""

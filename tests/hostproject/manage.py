#!/usr/bin/env python
"""A Django shop's own project, which adds the scheduler's apps from the installed package."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hostsite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)

"""Measuring real devices and links, and generating synthetic cluster topologies."""

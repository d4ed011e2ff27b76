"""Privacy accounting: μ-GDP (CLT), RDP and PLD accountants, noise calibration."""

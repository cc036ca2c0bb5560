"""Database backends: Django's, adjusted where this project measured a need."""

"""The rollout dashboard: a page served by the gateway at `/dashboard`, the JSON API behind it
under `/v1/`, and the operator actions it offers (see serve.dashboard.routes)."""

from serve.dashboard.routes import DashboardRoutes, router

__all__ = ["DashboardRoutes", "router"]

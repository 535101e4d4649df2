"""The job API (``idlegpu serve``): an authenticated HTTP front door to the job store.

``create_app(settings, store, clock=...)`` builds the FastAPI application; ``auth`` holds the
identities (idlegpu tokens, Kubernetes TokenReview, an authenticating proxy's headers) and the
roles. This package sits at the edge: it uses the store adapter and the spec loader, and
nothing of the pure core imports it.
"""

from idlegpu.scheduler.api.app import create_app

__all__ = ["create_app"]

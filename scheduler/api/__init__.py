"""The job API (``idlegpu serve``): an authenticated HTTP front door to the job store.

``add_api(app, settings, store, clock=...)`` puts its routes on an application
(``idlegpu.scheduler.server.create_server`` makes the one ``idlegpu serve`` runs, with the web
console beside it); ``auth`` holds the identities (idlegpu tokens, Kubernetes TokenReview, an
authenticating proxy's headers). The routes parse and answer HTTP; what they do is
``idlegpu.scheduler.service``'s. Nothing of the pure core imports this package.
"""

from idlegpu.scheduler.api.app import Api, add_api

__all__ = ["Api", "add_api"]

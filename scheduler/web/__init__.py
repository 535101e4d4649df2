"""What the job API and the web console share as HTTP edges of ``idlegpu serve``: every body
read under its route's limit (``bodies``), the security headers of every answer
(``headers``). Neither imports the other; ``idlegpu.scheduler.server`` mounts both."""

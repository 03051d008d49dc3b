"""RocketMQ 4.x compatible plain ACL (``[plugins] acl = "plain"``): accounts in ``plain_acl.yml``."""

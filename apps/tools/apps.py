from django.apps import AppConfig


class ToolsConfig(AppConfig):
    name = "apps.tools"
    label = "tools"
    verbose_name = "Governed tools (MCP servers)"

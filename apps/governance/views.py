from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def team_list(request: HttpRequest) -> HttpResponse:
    return render(request, "governance/team_list.html")

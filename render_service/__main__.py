from render_service.http.cli import main

main()

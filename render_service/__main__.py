from render_service.cli import main

main()

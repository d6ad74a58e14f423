// vlaked: the vlake pool daemon. Everything lives in vlake::pool (daemon.hpp).
#include "vlake/pool/daemon.hpp"

int main(int argc, char** argv) { return vlake::pool::vlaked_main(argc, argv); }

"""A fixed set of everyday English sentences for checking sentence encoders (written for lowbit).

They come in loose topic groups (weather, cooking, sport, finance, computing, travel, health, music), so
similarity between pairs ranges from near-paraphrase to unrelated.
"""

SENTENCES: tuple[str, ...] = (
    "It rained all afternoon, so the match was postponed.",
    "Heavy rain forced the organisers to delay the game.",
    "The forecast says tomorrow will be sunny and warm.",
    "Snow covered the mountain roads overnight.",
    "She baked a loaf of sourdough bread this morning.",
    "Fresh bread was cooling on the kitchen counter.",
    "Add a pinch of salt before the water boils.",
    "The soup needs to simmer for another twenty minutes.",
    "The striker scored twice in the second half.",
    "Our team lost the final by a single point.",
    "He runs five kilometres every day before work.",
    "The tennis championship starts next Monday.",
    "Shares of the bank dropped after the earnings report.",
    "Interest rates were raised by a quarter of a percent.",
    "Investors are worried about rising inflation.",
    "The company announced record profits this quarter.",
    "The laptop restarts whenever I open the spreadsheet.",
    "Please update the software before installing the driver.",
    "The database query takes too long on large tables.",
    "A new version of the compiler was released yesterday.",
    "Our flight to Lisbon was delayed by three hours.",
    "The train from Paris arrives at the central station at noon.",
    "We rented a small car to drive along the coast.",
    "The hotel room had a view of the old harbour.",
    "Regular exercise lowers the risk of heart disease.",
    "The doctor recommended drinking more water.",
    "He caught a cold after walking home in the rain.",
    "Vaccines train the immune system to recognise a virus.",
    "The orchestra played a symphony by Beethoven.",
    "She is learning to play the violin.",
    "The band released their first album in spring.",
    "A quiet piano melody filled the room.",
    "The cat is sleeping on the warm windowsill.",
    "A dog barked at the delivery van.",
    "The children built a sandcastle on the beach.",
    "The library closes early on Sundays.",
    "My grandmother grows tomatoes in her garden.",
    "The museum opened an exhibition of ancient maps.",
    "The bridge will be closed for repairs next week.",
    "Electric cars are becoming cheaper every year.",
)


def help_text_sentences() -> list[str]:
    """Every sentence of Python's own help text (``pydoc_data.topics``, in the standard library) of 50-300
    characters that is over 90 % letters or spaces, de-duplicated and shuffled with ``random.Random(0)``:
    the corpus of ../shared/reference/baselines-cpu.md section 4, and calibration text that never overlaps
    :data:`SENTENCES`."""
    import random
    import re

    from pydoc_data.topics import topics

    found = []
    for paragraph in topics.values():
        for sentence in re.split(r"(?<=[.!?])\s+", paragraph):
            sentence = " ".join(sentence.split())
            if 50 <= len(sentence) <= 300 and sum(c.isalpha() or c == " " for c in sentence) / len(sentence) > 0.9:
                found.append(sentence)
    found = list(dict.fromkeys(found))
    random.Random(0).shuffle(found)
    return found
